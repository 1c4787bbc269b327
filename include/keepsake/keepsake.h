/**
 * @file keepsake.h
 * Umbrella header: everything a program needs to save and restore the whole
 * state of a training run.
 */
#ifndef KEEPSAKE_H
#define KEEPSAKE_H

#include "keepsake/alloc.h"
#include "keepsake/convert.h"
#include "keepsake/dtype.h"
#include "keepsake/export.h"
#include "keepsake/format.h"
#include "keepsake/import.h"
#include "keepsake/io.h"
#include "keepsake/io_cache.h"
#include "keepsake/layout.h"
#include "keepsake/manager.h"
#include "keepsake/metric.h"
#include "keepsake/shard.h"
#include "keepsake/state.h"
#include "keepsake/statedict.h"
#include "keepsake/storage.h"
#include "keepsake/status.h"
#include "keepsake/tensor.h"
#include "keepsake/torch.h"
#include "keepsake/train.h"
#include "keepsake/version.h"

#endif

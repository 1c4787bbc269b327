/* Integrity-checked inputs of `keepsake convert` (see convert_input.h). */
#include "convert_input.h"

#include <stdio.h>
#include <stdlib.h>

#include "cli_common.h"
#include "keepsake/import.h"

static void salvaged(const ks_error *problem) { ks_cli_print_error(stderr, "convert: salvaged despite", problem); }

static ks_status import_buffer(const char *in, const void *buf, size_t len, int verify_crc, ks_statedict **out,
                               ks_meta **meta, ks_error *err) {
  ks_torch_read_opts ro = {0};
  ro.verify_crc = verify_crc;
  ks_import_opts io = {.read = &ro};
  ks_status st = ks_torch_import_buffer(buf, len, &io, out, meta, err);
  if (st && err && !err->file[0]) snprintf(err->file, sizeof err->file, "%s", in);
  return st;
}

ks_status ks_convert_read_torch(const ks_cli_input *src, int salvage, ks_statedict **out, ks_meta **meta,
                                ks_error *err) {
  void *buf = NULL;
  size_t len = 0;
  const char *in = src->arg;
  if (ks_cli_input_read(src, &buf, &len, err)) return err->code;
  ks_status st = import_buffer(in, buf, len, 1, out, meta, err);
  if (st == KS_E_CHECKSUM && salvage) { /* reported, then read again without the CRC checks */
    salvaged(err);
    st = import_buffer(in, buf, len, 0, out, meta, err);
  }
  free(buf); /* the import copies what it keeps */
  return st;
}

static int report(void *ctx, const ks_error *problem) {
  (*(size_t *)ctx)++;
  salvaged(problem);
  return 0;
}

ks_status ks_convert_read_keepsake(const ks_cli_input *src, int salvage, ks_statedict **sd, ks_meta **meta,
                                   ks_error *err) {
  ks_read_opts ro = src->ro;
  const char *in = src->path;
  ro.verify_checksums = !salvage;
  if (salvage) { /* every problem named first; what cannot be parsed at all still fails below */
    ks_reader *r = NULL;
    size_t problems = 0;
    if (ks_reader_open(in, &ro, &r, NULL) == KS_OK) ks_reader_verify_report(r, report, &problems, NULL);
    ks_reader_free(r);
  }
  ks_status st = ks_load(in, &ro, sd, meta, err);
  if (st) ks_cli_input_error(src, err);
  return st;
}

/*
 * torch.distributed helpers of the extension (for keepsake._distributed.manager): the rules the C
 * library applies to per-rank state, asked for rather than restated in Python.
 */
#include "ksext.h"

#include "keepsake/shard.h"

static PyObject *shard_assigned(PyObject *self, PyObject *args) {
  (void)self;
  int saved_world, world_size, rank, lo, hi, first;
  if (!PyArg_ParseTuple(args, "iii", &saved_world, &world_size, &rank)) return NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_shard_assigned(saved_world, world_size, rank, &lo, &hi, &first, &err);
  if (st) return ksp_raise(st, &err);
  return Py_BuildValue("(iii)", lo, hi, first);
}

PyMethodDef ksp_dist_methods[] = {
    {"shard_assigned", shard_assigned, METH_VARARGS,
     "shard_assigned(saved_world, world_size, rank, /)\n--\n\nks_shard_assigned: (lo, hi, first): rank `rank` of "
     "`world_size` folds the metrics of saved ranks [lo, hi) (default metrics when empty) and takes its other "
     "per-rank entries from saved rank `first`."},
    {NULL, NULL, 0, NULL}};

/*
 * A program built against an installed keepsake that uses the binding header: it links the
 * static library, where binding.h's calls are (libkeepsake.so does not export them). Counts
 * the reads of a lazy round trip through ks_io_counter_create, matches a glob with ks_path_match and
 * describes a metric with ks_metric_describe.
 */
#include <stdio.h>
#include <string.h>

#include <keepsake/binding.h>
#include <keepsake/keepsake.h>

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  ks_statedict *sd;
  ks_error err;
  float w[3] = {1.5f, -2.0f, 3.25f};
  int64_t shape[1] = {3};
  ks_tensor t;
  if (ks_statedict_create(NULL, &sd, NULL) || ks_tensor_init(&t, KS_F32, 1, shape, w) ||
      ks_statedict_set_tensor(sd, "model/w", &t, KS_BORROW, NULL) || ks_save(argv[1], sd, NULL, NULL, &err))
    return 1;
  ks_statedict_free(sd);
  ks_io *counter;
  if (ks_io_counter_create(NULL, 1, NULL, &counter, &err)) return 1;
  ks_read_opts o = KS_OPTS_INIT(ks_read_opts);
  o.mode = KS_READ_LAZY;
  o.io = counter;
  ks_reader *r;
  if (ks_reader_open(argv[1], &o, &r, &err)) return 1;
  float back[3];
  long i = ks_reader_find(r, "model/w");
  int ok = i >= 0 && ks_reader_fetch(r, (size_t)i, back, sizeof back, &err) == KS_OK && !memcmp(back, w, sizeof w);
  ks_reader_free(r);
  ks_io_counts c;
  ks_io_counter_get(counter, &c);
  ks_io_counter_free(counter);
  ok = ok && c.open_calls == 1 && c.read_calls >= 1 && c.map_calls == 0; /* a table without map_fn reads */
  ok = ok && ks_path_match("model", "model/w") && !ks_path_match("opt", "model/w");
  ks_metric *m = NULL;
  ok = ok && ks_metric_describe("MyMetric", NULL, NULL, &m, &err) == KS_OK &&
       ks_metric_describe_state(m, "total", KS_REDUCE_SUM, KS_F32, 0, NULL, 0, &err) == KS_OK &&
       ks_metric_state_count(m) == 1;
  ks_metric_free(m);
  printf("keepsake %s (static, binding.h): %s\n", ks_version(), ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

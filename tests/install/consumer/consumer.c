/* A program built against an installed keepsake: saves a tensor and reads it back. */
#include <stdio.h>
#include <string.h>

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
  ks_reader *r;
  ks_read_opts o = {.alloc = NULL, .mode = KS_READ_COPY, .verify_checksums = 1};
  if (ks_reader_open(argv[1], &o, &r, &err)) return 1;
  ks_tensor v;
  int ok = ks_reader_tensor(r, "model/w", &v, &err) == KS_OK && v.nbytes == sizeof w &&
           memcmp(v.data, w, sizeof w) == 0;
  ks_reader_free(r);
  printf("keepsake %s: %s\n", ks_version(), ok ? "round trip ok" : "round trip FAILED");
  return ok ? 0 : 1;
}

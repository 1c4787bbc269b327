/* C64, F8_E4M3FNUZ and F8_E5M2FNUZ: names, PyTorch's FP8 FNUZ conversions (fixture), the
 * widening table against exhaustive conversion, complex refusals, file round trips, hostile
 * headers. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/torch.h"
#include "test_format_helpers.h"

#define FNUZ_FIXTURE KS_FIXTURES_DIR "/dtypes/f8_fnuz.txt"

static char *tmp_dir;

static int setup(void **state) {
  (void)state;
  tmp_dir = ks_test_tmpdir("dtypes-new");
  return tmp_dir ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ks_test_rmtree(tmp_dir);
  free(tmp_dir);
  return 0;
}

static float f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t bits_of_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void names_sizes_and_codes(void **s) {
  (void)s;
  /* Appended: the earlier codes keep their values. */
  assert_int_equal(KS_F8_E4M3, 13);
  assert_int_equal(KS_F8_E5M2, 14);
  assert_int_equal(KS_C64, 15);
  assert_int_equal(KS_F8_E4M3FNUZ, 16);
  assert_int_equal(KS_F8_E5M2FNUZ, 17);
  assert_int_equal(KS_DTYPE_COUNT, 18);
  static const struct {
    const char *name;
    ks_dtype dt;
    size_t size;
    int is_float, is_complex;
  } want[] = {{"C64", KS_C64, 8, 0, 1},
              {"F8_E4M3FNUZ", KS_F8_E4M3FNUZ, 1, 1, 0},
              {"F8_E5M2FNUZ", KS_F8_E5M2FNUZ, 1, 1, 0}};
  for (size_t i = 0; i < 3; i++) {
    ks_dtype dt = KS_U8;
    assert_int_equal(ks_dtype_parse(want[i].name, strlen(want[i].name), &dt), KS_OK);
    assert_int_equal(dt, want[i].dt);
    assert_string_equal(ks_dtype_name(dt), want[i].name);
    assert_int_equal(ks_dtype_size(dt), want[i].size);
    assert_int_equal(!!ks_dtype_is_float(dt), want[i].is_float);
    assert_int_equal(!!ks_dtype_is_complex(dt), want[i].is_complex);
  }
  assert_false(ks_dtype_is_complex(KS_F32));
  assert_false(ks_dtype_is_complex((ks_dtype)KS_DTYPE_COUNT));
  static const char *const not_names[] = {"c64", "C128", "F8_E4M3FN", "F8_E4M3FNU", "F8_E5M2FNUZ ", "F8_E8M0", "F4"};
  for (size_t i = 0; i < sizeof not_names / sizeof not_names[0]; i++) {
    ks_dtype dt = KS_U8;
    assert_int_equal(ks_dtype_parse(not_names[i], strlen(not_names[i]), &dt), KS_E_DTYPE);
    assert_int_equal(dt, KS_U8);
  }
  /* A prefix of a longer name is not that name, and the longer one is not its prefix. */
  ks_dtype dt;
  assert_int_equal(ks_dtype_parse("F8_E4M3FNUZ", 7, &dt), KS_OK);
  assert_int_equal(dt, KS_F8_E4M3);
}

/* The fixture's lines of one kind, parsed; returns how many. */
typedef struct fnuz_row {
  uint32_t in;       /* decode: the byte; encode: float32 bits */
  int nan[2];        /* decode only: torch gives NaN */
  uint32_t out[2];   /* decode: float32 bits; encode: the byte (E4M3FNUZ, E5M2FNUZ) */
} fnuz_row;

static size_t read_fixture(const char *kind, fnuz_row *rows, size_t cap) {
  FILE *f = fopen(FNUZ_FIXTURE, "r");
  if (!f) fail_msg("cannot open %s", FNUZ_FIXTURE);
  char line[128], k[16], a[16], b[16], c[16];
  size_t n = 0;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || sscanf(line, "%15s %15s %15s %15s", k, a, b, c) != 4 || strcmp(k, kind)) continue;
    if (n == cap) fail_msg("fixture has more than %zu %s rows", cap, kind);
    fnuz_row *r = &rows[n++];
    r->in = (uint32_t)strtoul(a, NULL, 16);
    const char *o[2] = {b, c};
    for (int j = 0; j < 2; j++) {
      r->nan[j] = !strcmp(o[j], "nan");
      r->out[j] = r->nan[j] ? 0 : (uint32_t)strtoul(o[j], NULL, 16);
    }
  }
  fclose(f);
  return n;
}

static const ks_dtype fnuz[2] = {KS_F8_E4M3FNUZ, KS_F8_E5M2FNUZ};

static void fnuz_bytes_read_as_torch_reads_them(void **s) {
  (void)s;
  static fnuz_row rows[256];
  assert_int_equal(read_fixture("decode", rows, 256), 256);
  int nans[2] = {0, 0};
  for (size_t i = 0; i < 256; i++) {
    assert_int_equal(rows[i].in, i);
    uint8_t byte = (uint8_t)i;
    for (int j = 0; j < 2; j++) {
      double got = ks_dtype_get_f64(fnuz[j], &byte, 0);
      float direct = ks_test_from_bits(fnuz[j], byte);
      if (rows[i].nan[j]) {
        nans[j]++;
        assert_true(isnan(got) && isnan(direct));
        continue;
      }
      if (isnan(got) || got != (double)f32_of_bits(rows[i].out[j]))
        fail_msg("%s byte 0x%02zx: keepsake %a, torch %a", ks_dtype_name(fnuz[j]), i, got,
                 (double)f32_of_bits(rows[i].out[j]));
      assert_int_equal(bits_of_f32(direct), rows[i].out[j]); /* bit for bit: no -0 anywhere */
      assert_int_equal(!!signbit(got), !!(rows[i].out[j] >> 31));
    }
  }
  /* The FNUZ rules themselves, which the fixture must agree with. */
  assert_int_equal(nans[0], 1);
  assert_int_equal(nans[1], 1);
  assert_true(rows[0x80].nan[0] && rows[0x80].nan[1]);
  const ks_dtype e4 = KS_F8_E4M3FNUZ, e5 = KS_F8_E5M2FNUZ;
  assert_true(ks_test_from_bits(e4, 0x7F) == 240.0f && ks_test_from_bits(e4, 0xFF) == -240.0f);
  assert_true(ks_test_from_bits(e5, 0x7F) == 57344.0f && ks_test_from_bits(e5, 0xFF) == -57344.0f);
  assert_true(ks_test_from_bits(e4, 0x01) == 0x1p-10f && ks_test_from_bits(e5, 0x01) == 0x1p-17f);
  assert_true(ks_test_from_bits(e4, 0x40) == 1.0f && ks_test_from_bits(e5, 0x40) == 1.0f);
}

static void fnuz_encoding_rounds_as_torch_does(void **s) {
  (void)s;
  enum { CAP = 16384 };
  fnuz_row *rows = malloc(CAP * sizeof *rows);
  assert_non_null(rows);
  size_t n = read_fixture("encode", rows, CAP);
  assert_true(n > 6000);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float f = f32_of_bits(rows[i].in);
    uint8_t got[2];
    for (int j = 0; j < 2; j++) {
      assert_int_equal(ks_dtype_convert(fnuz[j], &got[j], KS_F32, &f, 1), KS_OK);
      uint8_t via = 0x55;
      ks_dtype_set_f64(fnuz[j], &via, 0, (double)f); /* exact: f is a float32 */
      if (got[j] != rows[i].out[j] || via != got[j]) {
        if (bad++ < 10)
          print_error("%s of %a (0x%08x): keepsake 0x%02x / 0x%02x, torch 0x%02x\n", ks_dtype_name(fnuz[j]),
                      (double)f, rows[i].in, got[j], via, rows[i].out[j]);
      }
    }
  }
  free(rows);
  assert_int_equal(bad, 0);
  /* The rules, spelled out: one NaN, no -0, overflow and infinities are NaN. */
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, -0.0f), 0x00);
  assert_int_equal(ks_test_to_bits(KS_F8_E5M2FNUZ, -0.0f), 0x00);
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, -0x1p-12f), 0x00); /* rounds to zero: +0, not 0x80 */
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, -INFINITY), 0x80);
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, NAN), 0x80);
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, 240.0f), 0x7F);
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, 248.0f), 0x80); /* ties to even past the top: NaN */
  assert_int_equal(ks_test_to_bits(KS_F8_E4M3FNUZ, -247.0f), 0xFF);
  assert_int_equal(ks_test_to_bits(KS_F8_E5M2FNUZ, 57344.0f), 0x7F);
  assert_int_equal(ks_test_to_bits(KS_F8_E5M2FNUZ, -1e6f), 0x80);
}

/* Exhaustively: does every value of 8-bit `from` survive conversion to `to`? */
static int converts_exactly(ks_dtype from, ks_dtype to) {
  int n = from == KS_BOOL ? 2 : 256;
  for (int v = 0; v < n; v++) {
    uint8_t in = (uint8_t)v, out[8] = {0};
    if (ks_dtype_convert(to, out, from, &in, 1) != KS_OK) return 0;
    double a = ks_dtype_get_f64(from, &in, 0), b = ks_dtype_get_f64(to, out, 0);
    if (isnan(a) != isnan(b)) return 0;
    if (!isnan(a) && (a != b || !!signbit(a) != !!signbit(b))) return 0;
  }
  return 1;
}

static void widening_table_matches_exhaustive_conversion(void **s) {
  (void)s;
  static const ks_dtype bytes[] = {KS_BOOL,    KS_U8,          KS_I8,         KS_F8_E4M3,
                                   KS_F8_E5M2, KS_F8_E4M3FNUZ, KS_F8_E5M2FNUZ};
  for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++)
    for (int to = 0; to < KS_DTYPE_COUNT; to++) {
      if (to == KS_C64) continue;
      int claimed = ks_dtype_widens_to(bytes[i], (ks_dtype)to), exact = converts_exactly(bytes[i], (ks_dtype)to);
      if (claimed != exact)
        fail_msg("%s -> %s: widens_to says %d, conversion of every value says %d", ks_dtype_name(bytes[i]),
                 ks_dtype_name((ks_dtype)to), claimed, exact);
    }
  /* The decisions, stated: FNUZ widens to the four wide floats and to no other 8-bit float. */
  for (int j = 0; j < 2; j++) {
    assert_true(ks_dtype_widens_to(fnuz[j], KS_F16) && ks_dtype_widens_to(fnuz[j], KS_BF16));
    assert_true(ks_dtype_widens_to(fnuz[j], KS_F32) && ks_dtype_widens_to(fnuz[j], KS_F64));
    assert_false(ks_dtype_widens_to(fnuz[j], KS_F8_E4M3) || ks_dtype_widens_to(fnuz[j], KS_F8_E5M2));
  }
  assert_false(ks_dtype_widens_to(KS_F8_E4M3, KS_F8_E4M3FNUZ)); /* 448 */
  assert_false(ks_dtype_widens_to(KS_F8_E5M2, KS_F8_E5M2FNUZ)); /* inf, -0 */
  /* Complex is an island: it widens only to itself, and nothing else widens to it. */
  for (int d = 0; d < KS_DTYPE_COUNT; d++) {
    assert_int_equal(ks_dtype_widens_to(KS_C64, (ks_dtype)d), d == KS_C64);
    assert_int_equal(ks_dtype_widens_to((ks_dtype)d, KS_C64), d == KS_C64);
  }
}

static void complex_refuses_scalar_and_real_conversion(void **s) {
  (void)s;
  float c[4] = {1.5f, -2.0f, 3.0f, 0.0f}, keep[4];
  memcpy(keep, c, sizeof c);
  assert_true(isnan(ks_dtype_get_f64(KS_C64, c, 0)));
  assert_true(isnan(ks_dtype_get_f64(KS_C64, c, 1))); /* even with a zero imaginary part */
  assert_int_equal(ks_dtype_get_i64(KS_C64, c, 0), 0);
  ks_dtype_set_f64(KS_C64, c, 0, 7.0);
  ks_dtype_set_i64(KS_C64, c, 1, 7);
  assert_memory_equal(c, keep, sizeof c);
  float real[2] = {9.0f, 9.0f};
  assert_int_equal(ks_dtype_convert(KS_F32, real, KS_C64, c, 2), KS_E_DTYPE);
  assert_true(real[0] == 9.0f && real[1] == 9.0f);
  assert_int_equal(ks_dtype_convert(KS_C64, c, KS_F32, real, 2), KS_E_DTYPE);
  assert_int_equal(ks_dtype_convert(KS_C64, c, KS_F64, real, 1), KS_E_DTYPE);
  assert_int_equal(ks_dtype_convert(KS_C64, c, KS_BOOL, real, 1), KS_E_DTYPE);
  assert_memory_equal(c, keep, sizeof c);
  float copy[4];
  assert_int_equal(ks_dtype_convert(KS_C64, copy, KS_C64, c, 2), KS_OK);
  assert_memory_equal(copy, c, sizeof c);
  /* FNUZ converts like any float: all 256 bytes to F32 and back. */
  uint8_t all[256], back[256];
  float wide[256];
  for (int i = 0; i < 256; i++) all[i] = (uint8_t)i;
  for (int j = 0; j < 2; j++) {
    assert_int_equal(ks_dtype_convert(KS_F32, wide, fnuz[j], all, 256), KS_OK);
    assert_int_equal(ks_dtype_convert(fnuz[j], back, KS_F32, wide, 256), KS_OK);
    assert_memory_equal(back, all, 256);
    assert_true(isnan(wide[0x80]) && wide[0] == 0.0f && !signbit(wide[0]));
  }
}

/* Every element of C64 with special parts, and every byte of both FNUZ formats. */
static ks_statedict *new_dtype_dict(void) {
  ks_statedict *sd;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  int64_t shape[2] = {2, 3}, n256 = 256;
  float *c;
  assert_int_equal(ks_statedict_new_tensor(sd, "model/c", KS_C64, 2, shape, (void **)&c, NULL), KS_OK);
  const float parts[12] = {1.0f, -2.5f, -0.0f, 0.0f, INFINITY, NAN, 3e38f, -1e-45f, 0.1f, 0.2f, -7.0f, 8.0f};
  memcpy(c, parts, sizeof parts);
  for (int j = 0; j < 2; j++) {
    uint8_t *b;
    assert_int_equal(ks_statedict_new_tensor(sd, ks_dtype_name(fnuz[j]), fnuz[j], 1, &n256, (void **)&b, NULL),
                     KS_OK);
    for (int i = 0; i < 256; i++) b[i] = (uint8_t)(255 - i);
  }
  float *c0;
  assert_int_equal(ks_statedict_new_tensor(sd, "c0", KS_C64, 0, NULL, (void **)&c0, NULL), KS_OK);
  c0[0] = 0.5f, c0[1] = -0.25f;
  int64_t empty[2] = {0, 4};
  assert_int_equal(ks_statedict_new_tensor(sd, "cempty", KS_C64, 2, empty, NULL, NULL), KS_OK);
  return sd;
}

static void assert_same_tensors(const ks_statedict *want, const ks_statedict *got) {
  assert_int_equal(ks_statedict_count(want), ks_statedict_count(got));
  for (size_t i = 0; i < ks_statedict_count(want); i++) {
    ks_entry a;
    assert_int_equal(ks_statedict_at(want, i, &a), KS_OK);
    const ks_tensor *b = ks_statedict_tensor(got, a.name);
    assert_non_null(b);
    assert_int_equal(b->dtype, a.tensor.dtype);
    assert_true(ks_tensor_same_shape(&a.tensor, b));
    assert_int_equal(b->nbytes, a.tensor.nbytes);
    if (b->nbytes) assert_memory_equal(b->data, a.tensor.data, b->nbytes);
  }
}

static void new_dtypes_round_trip_through_a_file(void **s) {
  (void)s;
  ks_statedict *sd = new_dtype_dict();
  char *path = ks_test_path(tmp_dir, "new.keepsake");
  ks_error err;
  assert_int_equal(ks_save(path, sd, NULL, NULL, &err), KS_OK);
  size_t len;
  uint8_t *bytes = ks_test_read_file(path, &len);
  assert_non_null(bytes);
  const char *hdr = (const char *)bytes + 8;
  size_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | bytes[i];
  assert_true(hl < len);
  char *h = strndup(hdr, hl);
  assert_non_null(strstr(h, "\"model/c\":{\"dtype\":\"C64\",\"shape\":[2,3],\"data_offsets\":[0,48]}"));
  assert_non_null(strstr(h, "\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[256]"));
  assert_non_null(strstr(h, "\"dtype\":\"F8_E5M2FNUZ\",\"shape\":[256]"));
  free(h);
  for (int mode = 0; mode < 2; mode++) {
    ks_read_opts o = {.mode = (ks_read_mode)mode, .verify_checksums = 1};
    ks_statedict *got;
    assert_int_equal(ks_load(path, &o, &got, NULL, &err), KS_OK);
    assert_same_tensors(sd, got);
    const ks_tensor *c = ks_statedict_tensor(got, "model/c");
    float re, im;
    memcpy(&re, (const uint8_t *)c->data + 8 * 5, 4);
    memcpy(&im, (const uint8_t *)c->data + 8 * 5 + 4, 4);
    assert_true(re == -7.0f && im == 8.0f); /* element [1,2]: real part first */
    ks_statedict_free(got);
  }
  ks_read_opts lazy = {.mode = KS_READ_LAZY, .verify_checksums = 1};
  fmt_mem_file m = {bytes, len};
  ks_io io = fmt_mem_io(&m);
  lazy.io = &io;
  ks_statedict *got;
  assert_int_equal(ks_load("<buffer>", &lazy, &got, NULL, &err), KS_OK);
  assert_same_tensors(sd, got);
  ks_statedict_free(got);
  /* A flipped bit in the C64 data (the first tensor) is caught by its checksum. */
  bytes[8 + hl + 3] ^= 0x40;
  ks_read_opts v = {.mode = KS_READ_COPY, .verify_checksums = 1};
  assert_int_equal(ks_load_buffer(bytes, len, &v, &got, NULL, &err), KS_E_CHECKSUM);
  assert_string_equal(err.key, "model/c");
  free(bytes);
  free(path);
  ks_statedict_free(sd);
}

static void hostile_c64_byte_lengths_are_refused(void **s) {
  (void)s;
  uint8_t data[24] = {0};
  static const struct {
    const char *header;
    size_t dlen;
    ks_status want;
  } cases[] = {
      /* 12 bytes for one 8-byte element: the span disagrees with the shape (section 5). */
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,12]}}", 12, KS_E_SHAPE},
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[3],\"data_offsets\":[0,20]}}", 20, KS_E_SHAPE},
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4, KS_E_SHAPE},
      /* A right-sized C64 tensor in a data section of 12 bytes: 4 trailing bytes. */
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 12, KS_E_FORMAT},
      /* A C64 tensor and a 1-byte FNUZ tensor that overlap by 4 bytes. */
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[4],\"data_offsets\":[4,8]}}",
       8, KS_E_FORMAT},
      {"{\"a\":{\"dtype\":\"C64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, KS_E_LIMIT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int mode = 0; mode < 3; mode++) {
      size_t len;
      uint8_t *b = fmt_build(cases[i].header, data, cases[i].dlen, &len);
      ks_error err;
      ks_status st = fmt_open_status(b, len, (ks_read_mode)mode, &err);
      if (st != cases[i].want)
        fail_msg("case %zu mode %d: %s, want %s (%s)", i, mode, ks_status_name(st), ks_status_name(cases[i].want),
                 err.message);
      if (cases[i].want == KS_E_SHAPE) {
        assert_string_equal(err.key, "a");
        assert_non_null(strstr(err.message, "C64"));
      }
      free(b);
    }
  /* Good sizes of the same dtypes open. */
  size_t len;
  uint8_t *b = fmt_build("{\"a\":{\"dtype\":\"C64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                         "\"b\":{\"dtype\":\"F8_E5M2FNUZ\",\"shape\":[2,4],\"data_offsets\":[16,24]}}",
                         data, 24, &len);
  ks_error err;
  for (int mode = 0; mode < 3; mode++) assert_int_equal(fmt_open_status(b, len, (ks_read_mode)mode, &err), KS_OK);
  free(b);
}

static void torch_save_export_refuses_the_new_dtypes(void **s) {
  (void)s;
  static const ks_dtype dts[] = {KS_C64, KS_F8_E4M3FNUZ, KS_F8_E5M2FNUZ};
  for (size_t i = 0; i < 3; i++) {
    ks_statedict *sd;
    assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
    int64_t n = 2;
    assert_int_equal(ks_statedict_new_tensor(sd, "t", dts[i], 1, &n, NULL, NULL), KS_OK);
    void *buf = NULL;
    size_t len = 0;
    ks_error err;
    ks_torch_write_opts wo = {0};
    assert_int_equal(ks_torch_save_buffer(sd, &wo, &buf, &len, &err), KS_E_DTYPE);
    assert_null(buf);
    assert_string_equal(err.key, "t");
    assert_non_null(strstr(err.message, ks_dtype_name(dts[i])));
    ks_statedict_free(sd);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(names_sizes_and_codes),
      cmocka_unit_test(fnuz_bytes_read_as_torch_reads_them),
      cmocka_unit_test(fnuz_encoding_rounds_as_torch_does),
      cmocka_unit_test(widening_table_matches_exhaustive_conversion),
      cmocka_unit_test(complex_refuses_scalar_and_real_conversion),
      cmocka_unit_test(new_dtypes_round_trip_through_a_file),
      cmocka_unit_test(hostile_c64_byte_lengths_are_refused),
      cmocka_unit_test(torch_save_export_refuses_the_new_dtypes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

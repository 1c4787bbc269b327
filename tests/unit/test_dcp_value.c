/*
 * The typed JSON of DCP non-tensor values (include/keepsake/binding/dcpvalue.h, docs/FORMAT.md 9.1):
 * the exact bytes the encoder writes, round trips, what older writers (Python's json) wrote,
 * and hostile input: deep nesting, huge numbers, bad UTF-8, truncation, malformed tags, dict
 * keys without a hash, allocation failures.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"
#include "testutil.h"

static ks_status decode(const char *text, size_t n, ks_dcp_doc **doc, ks_error *err) {
  return ks_dcp_doc_parse(text, n, NULL, doc, err);
}

/* Status of decoding text; the document is freed. */
static ks_status decode_status(const char *text, size_t n) {
  ks_dcp_doc *doc = NULL;
  ks_error err;
  ks_status st = decode(text, n, &doc, &err);
  if (st) assert_null(doc);
  ks_dcp_doc_free(doc);
  return st;
}

/* The value every round trip uses: [None, True, -7, 2**70, 1.5, nan, -inf, "a\0é😀\n\"", b"ab", BytesIO(b""),
   (1, (2,)), {"k": [], (1, "t"): {"n": None}}]. */
static void encode_sample(ks_dcp_encoder *e) {
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_none(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_bool(e, 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_int(e, -7, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_bigint(e, "1180591620717411303424", 22, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_float(e, 1.5, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_float(e, NAN, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_float(e, -INFINITY, NULL), KS_OK);
  static const char s[] = "a\0\xc3\xa9\xf0\x9f\x98\x80\n\"";
  assert_int_equal(ks_dcp_encoder_str(e, s, sizeof s - 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_bytes(e, KS_DCP_BYTES, "ab", 2, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_bytes(e, KS_DCP_BYTESIO, NULL, 0, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_int(e, 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_int(e, 2, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_str(e, "k", 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_int(e, 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_str(e, "t", 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_str(e, "n", 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_none(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
}

static const char sample_json[] =
    "[null,true,-7,1180591620717411303424,1.5,{\"float\":\"nan\"},{\"float\":\"-inf\"},"
    "\"a\\u0000\\u00e9\\ud83d\\ude00\\n\\\"\",{\"bytes\":\"YWI=\"},{\"bytesio\":\"\"},"
    "{\"tuple\":[1,{\"tuple\":[2]}]},{\"dict\":[[\"k\",[]],[{\"tuple\":[1,\"t\"]},{\"dict\":[[\"n\",null]]}]]}]";

static void check_sample(const ks_dcp_value *v) {
  assert_int_equal(v->kind, KS_DCP_LIST);
  assert_int_equal(v->count, 12);
  const ks_dcp_value *it = v->items;
  assert_int_equal(it[0].kind, KS_DCP_NONE);
  assert_int_equal(it[1].kind, KS_DCP_BOOL);
  assert_int_equal(it[1].i, 1);
  assert_int_equal(it[2].kind, KS_DCP_INT);
  assert_int_equal(it[2].i, -7);
  assert_int_equal(it[3].kind, KS_DCP_BIGINT);
  assert_string_equal(it[3].s, "1180591620717411303424");
  assert_int_equal(it[4].kind, KS_DCP_FLOAT);
  assert_true(it[4].f == 1.5);
  assert_true(isnan(it[5].f));
  assert_true(isinf(it[6].f) && it[6].f < 0);
  assert_int_equal(it[7].kind, KS_DCP_STR);
  assert_int_equal(it[7].len, 10);
  assert_memory_equal(it[7].s, "a\0\xc3\xa9\xf0\x9f\x98\x80\n\"", 10);
  assert_int_equal(it[8].kind, KS_DCP_BYTES);
  assert_int_equal(it[8].len, 2);
  assert_memory_equal(it[8].s, "ab", 2);
  assert_int_equal(it[9].kind, KS_DCP_BYTESIO);
  assert_int_equal(it[9].len, 0);
  assert_int_equal(it[10].kind, KS_DCP_TUPLE);
  assert_int_equal(it[10].count, 2);
  assert_int_equal(it[10].items[1].kind, KS_DCP_TUPLE);
  assert_int_equal(it[10].items[1].items[0].i, 2);
  const ks_dcp_value *d = &it[11];
  assert_int_equal(d->kind, KS_DCP_DICT);
  assert_int_equal(d->count, 2);
  assert_string_equal(d->items[0].s, "k");
  assert_int_equal(d->items[1].kind, KS_DCP_LIST);
  assert_int_equal(d->items[1].count, 0);
  assert_int_equal(d->items[2].kind, KS_DCP_TUPLE);
  assert_string_equal(d->items[2].items[1].s, "t");
  assert_int_equal(d->items[3].kind, KS_DCP_DICT);
  assert_int_equal(d->items[3].count, 1);
  assert_int_equal(d->items[3].items[1].kind, KS_DCP_NONE);
}

static void encodes_exact_ascii_bytes_and_decodes_them_back(void **s) {
  (void)s;
  ks_dcp_encoder *e;
  assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
  encode_sample(e);
  const char *json;
  size_t n;
  assert_int_equal(ks_dcp_encoder_result(e, &json, &n, NULL), KS_OK);
  char *text = malloc(n + 1);
  assert_non_null(text);
  memcpy(text, json, n);
  text[n] = '\0';
  assert_string_equal(text, sample_json);
  free(text);
  for (size_t i = 0; i < n; i++) assert_true((unsigned char)json[i] < 0x80);
  ks_dcp_doc *doc;
  ks_error err;
  assert_int_equal(decode(json, n, &doc, &err), KS_OK);
  check_sample(ks_dcp_doc_root(doc));
  ks_dcp_doc_free(doc);
  ks_dcp_encoder_free(e);
}

/* Every base64 tail, and floats that must read back to the same double. */
static void bytes_and_floats_round_trip(void **s) {
  (void)s;
  static const double floats[] = {0.0, -0.0, 0.1, 1e16, 1e-7, 123456789.0, 5e-324, 1.7976931348623157e308, -2.5};
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
    ks_dcp_encoder *e;
    assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
    assert_int_equal(ks_dcp_encoder_float(e, floats[i], NULL), KS_OK);
    const char *json;
    size_t n;
    assert_int_equal(ks_dcp_encoder_result(e, &json, &n, NULL), KS_OK);
    assert_non_null(memchr(json, '.', n) ? json : memchr(json, 'e', n)); /* read back as a float */
    ks_dcp_doc *doc;
    assert_int_equal(decode(json, n, &doc, NULL), KS_OK);
    assert_int_equal(ks_dcp_doc_root(doc)->kind, KS_DCP_FLOAT);
    assert_memory_equal(&ks_dcp_doc_root(doc)->f, &floats[i], sizeof(double)); /* -0.0 too */
    ks_dcp_doc_free(doc);
    ks_dcp_encoder_free(e);
  }
  uint8_t raw[300];
  for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)(i * 37 + 11);
  for (size_t len = 0; len < sizeof raw; len += len < 8 ? 1 : 97) {
    ks_dcp_encoder *e;
    assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
    assert_int_equal(ks_dcp_encoder_bytes(e, KS_DCP_BYTES, raw, len, NULL), KS_OK);
    const char *json;
    size_t n;
    assert_int_equal(ks_dcp_encoder_result(e, &json, &n, NULL), KS_OK);
    ks_dcp_doc *doc;
    assert_int_equal(decode(json, n, &doc, NULL), KS_OK);
    assert_int_equal(ks_dcp_doc_root(doc)->len, len);
    if (len) assert_memory_equal(ks_dcp_doc_root(doc)->s, raw, len);
    ks_dcp_doc_free(doc);
    ks_dcp_encoder_free(e);
  }
}

/* A Python str may hold a lone surrogate: its 3-byte form (WTF-8) is written as its \\u escape, and
   escapes of lone surrogates (as Python's json wrote them) decode back to that form. A pair of
   escapes is one code point; raw surrogate bytes in the input are still not UTF-8. */
static void lone_surrogates_round_trip(void **s) {
  (void)s;
  ks_dcp_encoder *e;
  assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
  static const char str[] = "\xc3\xa4\xed\xb2\x80\xed\xa0\xbd"; /* "\u00e4\udc80\ud83d" */
  assert_int_equal(ks_dcp_encoder_str(e, str, sizeof str - 1, NULL), KS_OK);
  const char *json;
  size_t n;
  assert_int_equal(ks_dcp_encoder_result(e, &json, &n, NULL), KS_OK);
  assert_int_equal(n, 20);
  assert_memory_equal(json, "\"\\u00e4\\udc80\\ud83d\"", 20);
  ks_dcp_doc *doc;
  assert_int_equal(decode(json, n, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->len, sizeof str - 1);
  assert_memory_equal(ks_dcp_doc_root(doc)->s, str, sizeof str - 1);
  ks_dcp_doc_free(doc);
  ks_dcp_encoder_free(e);
  assert_int_equal(decode("\"\\ud83d\\ude00\"", 14, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->len, 4);
  assert_memory_equal(ks_dcp_doc_root(doc)->s, "\xf0\x9f\x98\x80", 4);
  ks_dcp_doc_free(doc);
  assert_int_equal(decode("\"\\ud800\\ud800\"", 14, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->len, 6);
  ks_dcp_doc_free(doc);
  assert_int_equal(decode_status("\"\xed\xa0\x80\"", 5), KS_E_FORMAT);
}

/* What keepsake's Python encoder (json.dumps) wrote before the rules moved into C still decodes,
   spacing, raw UTF-8 and exponent forms included. */
static void older_writers_output_still_decodes(void **s) {
  (void)s;
  static const char planner[] = " {\"dict\": [[\"model.w\", [\"model\", \"w\"]], [\"lr\", 0.0003],"
                                " [\"betas\", {\"tuple\": [0.9, 0.95]}], [\"big\", -1e+16], [\"caf\xc3\xa9\", 1E-5]]} ";
  ks_dcp_doc *doc;
  ks_error err;
  assert_int_equal(decode(planner, sizeof planner - 1, &doc, &err), KS_OK);
  const ks_dcp_value *v = ks_dcp_doc_root(doc);
  assert_int_equal(v->kind, KS_DCP_DICT);
  assert_int_equal(v->count, 5);
  assert_int_equal(v->items[1].kind, KS_DCP_LIST);
  assert_true(v->items[3].f == 0.0003);
  assert_int_equal(v->items[5].kind, KS_DCP_TUPLE);
  assert_true(v->items[7].f == -1e16);
  assert_string_equal(v->items[8].s, "caf\xc3\xa9");
  assert_true(v->items[9].f == 1e-5);
  ks_dcp_doc_free(doc);
}

static char *nested(const char *open, const char *mid, const char *close, size_t levels) {
  size_t o = strlen(open), m = strlen(mid), c = strlen(close);
  char *t = malloc(levels * (o + c) + m + 1);
  assert_non_null(t);
  char *p = t;
  for (size_t i = 0; i < levels; i++, p += o) memcpy(p, open, o);
  memcpy(p, mid, m);
  p += m;
  for (size_t i = 0; i < levels; i++, p += c) memcpy(p, close, c);
  *p = '\0';
  return t;
}

static void hostile_nesting_and_numbers_are_refused(void **s) {
  (void)s;
  /* Lists: the innermost at level 100 is kept, at 101 refused; 100,000 levels do not recurse away. */
  char *t = nested("[", "", "]", KS_DCP_MAX_DEPTH + 1);
  assert_int_equal(decode_status(t, strlen(t)), KS_OK);
  free(t);
  t = nested("[", "", "]", KS_DCP_MAX_DEPTH + 2);
  ks_dcp_doc *doc = NULL;
  ks_error err;
  assert_int_equal(decode(t, strlen(t), &doc, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "nested deeper"));
  free(t);
  t = nested("[", "", "]", 100000);
  assert_int_equal(decode_status(t, strlen(t)), KS_E_LIMIT);
  free(t);
  t = nested("{\"tuple\":[", "1", "]}", 100000);
  assert_int_equal(decode_status(t, strlen(t)), KS_E_LIMIT);
  free(t);
  t = nested("{\"dict\":[[1,", "1", "]]}", 100000);
  assert_int_equal(decode_status(t, strlen(t)), KS_E_LIMIT);
  free(t);
  /* Integers: KS_DCP_MAX_DIGITS digits are kept (as digits), one more is refused. */
  char *big = malloc(KS_DCP_MAX_DIGITS + 3);
  assert_non_null(big);
  big[0] = '-';
  memset(big + 1, '9', KS_DCP_MAX_DIGITS + 1);
  big[KS_DCP_MAX_DIGITS + 2] = '\0';
  assert_int_equal(decode_status(big, KS_DCP_MAX_DIGITS + 2), KS_E_LIMIT);
  assert_int_equal(decode(big, KS_DCP_MAX_DIGITS + 1, &doc, &err), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->kind, KS_DCP_BIGINT);
  assert_int_equal(ks_dcp_doc_root(doc)->len, KS_DCP_MAX_DIGITS + 1);
  ks_dcp_doc_free(doc);
  free(big);
  assert_int_equal(decode(" -9223372036854775808", 21, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->kind, KS_DCP_INT);
  assert_true(ks_dcp_doc_root(doc)->i == INT64_MIN);
  ks_dcp_doc_free(doc);
  assert_int_equal(decode("9223372036854775808", 19, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->kind, KS_DCP_BIGINT);
  ks_dcp_doc_free(doc);
  static const char *const bad_numbers[] = {"1e400", "-1e309", "01", "-", "1.", ".5", "1e", "+1", "0x10", "NaN",
                                            "Infinity", "1.0e+", "--1"};
  for (size_t i = 0; i < sizeof bad_numbers / sizeof bad_numbers[0]; i++)
    if (decode_status(bad_numbers[i], strlen(bad_numbers[i])) != KS_E_FORMAT) fail_msg("%s decoded", bad_numbers[i]);
  char longreal[420] = "0.";
  memset(longreal + 2, '1', 410);
  longreal[412] = '\0';
  assert_int_equal(decode_status(longreal, strlen(longreal)), KS_E_FORMAT);
}

#define CASE(text) {text, sizeof text - 1}

static void malformed_text_and_tags_are_format_errors(void **s) {
  (void)s;
  static const struct {
    const char *text;
    size_t n;
  } cases[] = {
      CASE(""),
      CASE("   "),
      CASE("nul"),
      CASE("null null"),
      CASE("\"\xff\""),                 /* bad UTF-8 */
      CASE("\"\xc0\xaf\""),             /* overlong */
      CASE("\"\xed\xa0\x80\""),         /* a surrogate in UTF-8 */
      CASE("\"\\x\""),
      CASE("\"a\nb\""),                 /* a raw control character */
      CASE("[1,]"),
      CASE("[1 2]"),
      CASE("{}"),
      CASE("{\"list\":[1]}"),
      CASE("{\"float\":\"NaN\"}"),
      CASE("{\"float\":1.5}"),
      CASE("{\"tuple\":[1],\"tuple\":[2]}"),
      CASE("{\"tuple\":1}"),
      CASE("{\"bytes\":\"abc\"}"),
      CASE("{\"bytes\":\"ab!=\"}"),
      CASE("{\"bytes\":\"a===\"}"),
      CASE("{\"bytes\":\"=abc\"}"),
      CASE("{\"bytes\":\"YW\\nI=\"}"),
      CASE("{\"bytesio\":null}"),
      CASE("{\"dict\":[[1]]}"),
      CASE("{\"dict\":[[1,2,3]]}"),
      CASE("{\"dict\":[1]}"),
      CASE("{\"dict\":[[[1],2]]}"),                  /* a list key: no hash */
      CASE("{\"dict\":[[{\"dict\":[]},2]]}"),       /* a dict key */
      CASE("{\"dict\":[[{\"tuple\":[[1]]},2]]}"),    /* a tuple key holding a list */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ks_dcp_doc *doc = NULL;
    ks_error err;
    ks_status st = decode(cases[i].text, cases[i].n, &doc, &err);
    if (st != KS_E_FORMAT) fail_msg("case %zu (%.*s): %s", i, (int)cases[i].n, cases[i].text, ks_status_name(st));
    assert_null(doc);
    assert_non_null(strstr(err.message, "object"));
  }
  /* Every proper prefix of a valid encoding is refused, never read past. */
  for (size_t n = 0; n < sizeof sample_json - 1; n++) {
    char *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees any read past them */
    assert_non_null(copy);
    memcpy(copy, sample_json, n);
    ks_status st = decode_status(copy, n);
    if (st != KS_E_FORMAT) fail_msg("prefix of %zu bytes: %s", n, ks_status_name(st));
    free(copy);
  }
  /* A tuple key (hashable) and a bytes key are fine. */
  static const char ok[] = "{\"dict\":[[{\"tuple\":[1,{\"bytes\":\"\"}]},{\"bytesio\":\"AA==\"}]]}";
  ks_dcp_doc *doc;
  assert_int_equal(decode(ok, sizeof ok - 1, &doc, NULL), KS_OK);
  assert_int_equal(ks_dcp_doc_root(doc)->items[1].len, 1);
  ks_dcp_doc_free(doc);
}

static void the_encoder_refuses_and_latches(void **s) {
  (void)s;
  ks_dcp_encoder *e;
  ks_error err;
  const char *json;
  size_t n;
  /* Depth: a value at level 100 is kept, at 101 refused, and the failure latches. */
  assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
  for (int i = 0; i < KS_DCP_MAX_DEPTH; i++) assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_int(e, 1, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, &err), KS_OK); /* itself at level 100 */
  assert_int_equal(ks_dcp_encoder_none(e, &err), KS_E_LIMIT);            /* its item at 101 */
  assert_non_null(strstr(err.message, "nested deeper"));
  assert_int_equal(ks_dcp_encoder_end(e, &err), KS_E_LIMIT);
  assert_int_equal(ks_dcp_encoder_result(e, &json, &n, &err), KS_E_LIMIT);
  ks_dcp_encoder_free(e);

  static const struct {
    int what;
    ks_status want;
  } refusals[] = {{0, KS_E_INVALID},     {1, KS_E_INVALID},     {2, KS_E_UNSUPPORTED}, {3, KS_E_UNSUPPORTED},
                  {4, KS_E_STATE},       {5, KS_E_STATE},       {6, KS_E_STATE},       {7, KS_E_INVALID},
                  {8, KS_E_LIMIT},       {9, KS_E_INVALID},     {10, KS_E_INVALID}};
  char *digits = malloc(KS_DCP_MAX_DIGITS + 1);
  assert_non_null(digits);
  memset(digits, '7', KS_DCP_MAX_DIGITS + 1);
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
    assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
    ks_status st = KS_OK;
    switch (refusals[i].what) {
      case 0: st = ks_dcp_encoder_str(e, "\xe0\x80\xaf", 3, &err); break; /* overlong */
      case 1: st = ks_dcp_encoder_str(e, "\xff", 1, &err); break;
      case 2: /* a list as a dict key */
        assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
        st = ks_dcp_encoder_begin(e, KS_DCP_LIST, &err);
        break;
      case 3: /* a tuple key holding a dict */
        assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
        assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, NULL), KS_OK);
        st = ks_dcp_encoder_begin(e, KS_DCP_DICT, &err);
        break;
      case 4: /* a dict key without its value */
        assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
        assert_int_equal(ks_dcp_encoder_int(e, 1, NULL), KS_OK);
        st = ks_dcp_encoder_end(e, &err);
        break;
      case 5: /* two top values */
        assert_int_equal(ks_dcp_encoder_none(e, NULL), KS_OK);
        st = ks_dcp_encoder_none(e, &err);
        break;
      case 6: /* no value yet */
        assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL), KS_OK);
        st = ks_dcp_encoder_result(e, &json, &n, &err);
        break;
      case 7: st = ks_dcp_encoder_bigint(e, "012", 3, &err); break;
      case 8: st = ks_dcp_encoder_bigint(e, digits, KS_DCP_MAX_DIGITS + 1, &err); break;
      case 9: st = ks_dcp_encoder_bytes(e, KS_DCP_STR, "x", 1, &err); break;
      default: st = ks_dcp_encoder_begin(e, KS_DCP_BYTES, &err); break;
    }
    if (st != refusals[i].want) fail_msg("refusal %zu: %s", i, ks_status_name(st));
    assert_int_equal(err.code, refusals[i].want);
    ks_dcp_encoder_free(e);
  }
  /* A value after a tuple key of the dict is fine: the key context ends with the key. */
  assert_int_equal(ks_dcp_encoder_create(NULL, &e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_DICT, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_TUPLE, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_bigint(e, digits, KS_DCP_MAX_DIGITS, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_end(e, NULL), KS_OK);
  assert_int_equal(ks_dcp_encoder_result(e, &json, &n, NULL), KS_OK);
  assert_memory_equal(json, "{\"dict\":[[{\"tuple\":[]},[7777", 28);
  ks_dcp_encoder_free(e);
  free(digits);
}

/* A dict holds no two keys a Python dict would take as one (its value would replace the first's),
   and base64 is canonical (zero padding bits): each refused naming the key or the character. */
static void repeated_keys_and_noncanonical_base64_are_refused(void **s) {
  (void)s;
  static const struct {
    const char *text, *message;
  } refused[] = {
      {"{\"dict\":[[\"lr\",0.1],[\"lr\",0.2]]}", "the key 'lr' twice (items 0 and 1)"},
      {"{\"dict\":[[\"a\",1],[\"b\",2],[\"c\",3],[\"b\",4],[\"a\",5]]}", "the key 'b' twice (items 1 and 3)"},
      {"{\"dict\":[[1,1],[true,2]]}", "equal keys 1 and True (items 0 and 1)"},
      {"{\"dict\":[[0,1],[-0.0,2]]}", "equal keys 0 and -0.0"},
      {"{\"dict\":[[2,1],[2.0,2]]}", "equal keys 2 and 2.0"},
      {"{\"dict\":[[9223372036854775808,1],[9.223372036854776e18,2]]}", "(items 0 and 1)"},
      {"{\"dict\":[[{\"float\":\"inf\"},1],[1e999999,2]]}", NULL}, /* 1e999999 is out of range anyway */
      {"{\"dict\":[[{\"float\":\"inf\"},1],[{\"float\":\"inf\"},2]]}", "the key inf twice"},
      {"{\"dict\":[[null,1],[null,2]]}", "the key None twice"},
      {"{\"dict\":[[{\"bytes\":\"YQ==\"},1],[{\"bytes\":\"YQ==\"},2]]}", "the key b'a' twice"},
      {"{\"dict\":[[{\"tuple\":[1,\"x\"]},1],[{\"tuple\":[1.0,\"x\"]},2]]}", "(a tuple of 2 items) twice"},
      {"[{\"dict\":[]},{\"dict\":[[\"k\",{\"dict\":[[\"j\",1],[\"j\",2]]}]]}]", "the key 'j' twice"},
      {"{\"bytes\":\"QR==\"}", "character 1 ('R') sets bits the padding drops"},
      {"{\"bytes\":\"QUJ=\"}", "character 2 ('J') sets bits the padding drops"},
      {"{\"bytesio\":\"AAAAQf==\"}", "character 5 ('f')"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    ks_dcp_doc *doc = NULL;
    ks_error err;
    ks_status st = decode(refused[i].text, strlen(refused[i].text), &doc, &err);
    if (st != KS_E_FORMAT || (refused[i].message && !strstr(err.message, refused[i].message)))
      fail_msg("%s: %s: %s", refused[i].text, ks_status_name(st), err.message);
    assert_null(doc);
  }
  static const char *const kept[] = {
      "{\"dict\":[[{\"float\":\"nan\"},1],[{\"float\":\"nan\"},2]]}", /* NaN equals nothing */
      "{\"dict\":[[1,1],[\"1\",2],[{\"tuple\":[1]},3],[{\"bytes\":\"MQ==\"},4],[1.5,5],[null,6]]}",
      "{\"dict\":[[9223372036854775807,1],[9.223372036854776e18,2]]}", /* 2^63 - 1 is no double */
      "{\"dict\":[[9223372036854775809,1],[9223372036854775808,2]]}",
      "{\"dict\":[[{\"tuple\":[{\"float\":\"nan\"}]},1],[{\"tuple\":[{\"float\":\"nan\"}]},2]]}",
      "{\"dict\":[[\"lr\",1]]}",
      "[{\"dict\":[[\"k\",1]]},{\"dict\":[[\"k\",2]]}]", /* the same key in two dicts */
      "{\"bytes\":\"QQ==\"}",
      "{\"bytes\":\"QUI=\"}",
      "{\"bytes\":\"\"}",
  };
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
    ks_dcp_doc *doc = NULL;
    ks_error err;
    ks_status st = decode(kept[i], strlen(kept[i]), &doc, &err);
    if (st) fail_msg("%s: %s: %s", kept[i], ks_status_name(st), err.message);
    ks_dcp_doc_free(doc);
  }
  /* Many keys: one repeat among 100,000 is found (sorted, not compared pairwise). */
  size_t cap = 100000 * 24 + 64, n = 0;
  char *big = malloc(cap);
  assert_non_null(big);
  n += (size_t)snprintf(big + n, cap - n, "{\"dict\":[");
  for (int k = 0; k < 100000; k++) n += (size_t)snprintf(big + n, cap - n, "%s[\"k%d\",%d]", k ? "," : "", k, k);
  snprintf(big + n, cap - n, "]}");
  ks_dcp_doc *doc = NULL;
  assert_int_equal(decode(big, strlen(big), &doc, NULL), KS_OK);
  ks_dcp_doc_free(doc);
  memcpy(strstr(big, "[\"k99999\""), "[\"k77777\"", 9);
  ks_error err;
  assert_int_equal(decode(big, strlen(big), &doc, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "the key 'k77777' twice (items 77777 and 99999)"));
  free(big);
}

/* Every allocation failing in turn: KS_E_NOMEM, nothing leaked. */
static void allocation_failures_leak_nothing(void **s) {
  (void)s;
  ks_status st = KS_E_NOMEM;
  for (long k = 1; st == KS_E_NOMEM; k++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, k);
    ks_dcp_encoder *e = NULL;
    st = ks_dcp_encoder_create(&ta.a, &e, NULL);
    if (!st) {
      const char *json;
      size_t n;
      st = ks_dcp_encoder_begin(e, KS_DCP_LIST, NULL);
      for (int i = 0; !st && i < 200; i++) st = ks_dcp_encoder_str(e, "longer than the buffer's start", 30, NULL);
      if (!st) st = ks_dcp_encoder_end(e, NULL);
      if (!st) st = ks_dcp_encoder_result(e, &json, &n, NULL);
      ks_dcp_encoder_free(e);
    }
    if (st && st != KS_E_NOMEM) fail_msg("encoder, allocation %ld: %s", k, ks_status_name(st));
    assert_int_equal(ta.live, 0);
  }
  st = KS_E_NOMEM;
  for (long k = 1; st == KS_E_NOMEM; k++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, k);
    ks_dcp_doc *doc = NULL;
    st = ks_dcp_doc_parse(sample_json, sizeof sample_json - 1, &ta.a, &doc, NULL);
    if (st && st != KS_E_NOMEM) fail_msg("decoder, allocation %ld: %s", k, ks_status_name(st));
    if (!st) check_sample(ks_dcp_doc_root(doc));
    ks_dcp_doc_free(doc);
    assert_int_equal(ta.live, 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(encodes_exact_ascii_bytes_and_decodes_them_back),
      cmocka_unit_test(bytes_and_floats_round_trip),
      cmocka_unit_test(lone_surrogates_round_trip),
      cmocka_unit_test(older_writers_output_still_decodes),
      cmocka_unit_test(hostile_nesting_and_numbers_are_refused),
      cmocka_unit_test(malformed_text_and_tags_are_format_errors),
      cmocka_unit_test(the_encoder_refuses_and_latches),
      cmocka_unit_test(repeated_keys_and_noncanonical_base64_are_refused),
      cmocka_unit_test(allocation_failures_leak_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

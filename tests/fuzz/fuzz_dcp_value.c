/*
 * libFuzzer target: the typed JSON of DCP non-tensor values (ks_dcp_doc_parse). Any input is
 * refused with a status or decoded; a decoded value is encoded again (which must succeed: the
 * decoder accepts nothing the encoder refuses), that encoding must decode to the same tree, and
 * encoding it once more must give the same bytes. The corpus (corpus/dcp_value/) holds an
 * encoder's output, Python-era planner data and hostile inputs.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "keepsake/binding/dcpvalue.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ks_status encode(ks_dcp_encoder *e, const ks_dcp_value *v) {
  switch (v->kind) {
    case KS_DCP_NONE: return ks_dcp_encoder_none(e, NULL);
    case KS_DCP_BOOL: return ks_dcp_encoder_bool(e, (int)v->i, NULL);
    case KS_DCP_INT: return ks_dcp_encoder_int(e, v->i, NULL);
    case KS_DCP_BIGINT: return ks_dcp_encoder_bigint(e, v->s, v->len, NULL);
    case KS_DCP_FLOAT: return ks_dcp_encoder_float(e, v->f, NULL);
    case KS_DCP_STR: return ks_dcp_encoder_str(e, v->s, v->len, NULL);
    case KS_DCP_BYTES:
    case KS_DCP_BYTESIO: return ks_dcp_encoder_bytes(e, v->kind, v->s, v->len, NULL);
    default: break;
  }
  ks_status st = ks_dcp_encoder_begin(e, v->kind, NULL);
  size_t n = v->kind == KS_DCP_DICT ? 2 * v->count : v->count;
  for (size_t i = 0; !st && i < n; i++) st = encode(e, &v->items[i]);
  return st ? st : ks_dcp_encoder_end(e, NULL);
}

static int same(const ks_dcp_value *a, const ks_dcp_value *b) {
  if (a->kind != b->kind) return 0;
  switch (a->kind) {
    case KS_DCP_NONE: return 1;
    case KS_DCP_BOOL:
    case KS_DCP_INT: return a->i == b->i;
    case KS_DCP_FLOAT: return isnan(a->f) ? isnan(b->f) : !memcmp(&a->f, &b->f, sizeof a->f);
    case KS_DCP_BIGINT:
    case KS_DCP_STR:
    case KS_DCP_BYTES:
    case KS_DCP_BYTESIO: return a->len == b->len && (!a->len || !memcmp(a->s, b->s, a->len));
    default: break;
  }
  if (a->count != b->count) return 0;
  size_t n = a->kind == KS_DCP_DICT ? 2 * a->count : a->count;
  for (size_t i = 0; i < n; i++)
    if (!same(&a->items[i], &b->items[i])) return 0;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ks_dcp_doc *doc = NULL, *again = NULL;
  if (ks_dcp_doc_parse(data, size, NULL, &doc, NULL) != KS_OK) return 0;
  ks_dcp_encoder *e1 = NULL, *e2 = NULL;
  const char *j1, *j2;
  size_t n1, n2;
  if (ks_dcp_encoder_create(NULL, &e1, NULL) || encode(e1, ks_dcp_doc_root(doc)) ||
      ks_dcp_encoder_result(e1, &j1, &n1, NULL))
    __builtin_trap();
  if (ks_dcp_doc_parse(j1, n1, NULL, &again, NULL) || !same(ks_dcp_doc_root(doc), ks_dcp_doc_root(again)))
    __builtin_trap();
  if (ks_dcp_encoder_create(NULL, &e2, NULL) || encode(e2, ks_dcp_doc_root(again)) ||
      ks_dcp_encoder_result(e2, &j2, &n2, NULL) || n1 != n2 || memcmp(j1, j2, n1))
    __builtin_trap();
  for (size_t i = 0; i < n1; i++)
    if ((uint8_t)j1[i] >= 0x80) __builtin_trap(); /* ASCII only */
  ks_dcp_encoder_free(e1);
  ks_dcp_encoder_free(e2);
  ks_dcp_doc_free(again);
  ks_dcp_doc_free(doc);
  return 0;
}

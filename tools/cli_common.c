/* Helpers shared by the keepsake subcommands (see cli_common.h). */
#include "cli_common.h"
#include "keepsake/layout.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


void ks_cli_print_error(FILE *out, const char *cmd, const ks_error *err) {
  char line[KS_ERROR_MSG_MAX + 3 * KS_ERROR_WHERE_MAX];
  fprintf(out, "keepsake %s: %s\n", cmd, ks_error_format(err, line, sizeof line));
}

int ks_cli_wants_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
  return 0;
}

const char *ks_cli_shape(const ks_tensor *t, char *buf, size_t cap) {
  return ks_shape_format(t->rank, t->shape, buf, cap);
}

/* The shortest %g form that reads back as the same double. */
static void shortest_double(double v, char *buf, size_t cap) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, v);
    if (!isfinite(v) || strtod(buf, NULL) == v) return;
  }
}

/* A string as a JSON literal, so quotes and control characters stay visible. */
static void quoted(const char *s, char *buf, size_t cap) {
  json_t *j = json_string(s);
  char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
  snprintf(buf, cap, "%s", q ? q : "\"?\"");
  free(q);
  json_decref(j);
}

const char *ks_cli_scalar_text(const ks_entry *e, char *buf, size_t cap) {
  switch (e->kind) {
    case KS_VAL_INT: snprintf(buf, cap, "%" PRId64, e->i); break;
    case KS_VAL_FLOAT: shortest_double(e->f, buf, cap); break;
    case KS_VAL_BOOL: snprintf(buf, cap, "%s", e->i ? "true" : "false"); break;
    case KS_VAL_STRING: quoted(e->s, buf, cap); break;
    case KS_VAL_NULL: snprintf(buf, cap, "null"); break;
    default: snprintf(buf, cap, "<tensor>"); break;
  }
  return buf;
}

json_t *ks_cli_scalar_json(const ks_entry *e) {
  switch (e->kind) {
    case KS_VAL_INT: return json_integer((json_int_t)e->i);
    case KS_VAL_FLOAT:
      if (isfinite(e->f)) return json_real(e->f);
      return json_string(isnan(e->f) ? "nan" : e->f > 0 ? "inf" : "-inf");
    case KS_VAL_BOOL: return json_boolean(e->i);
    case KS_VAL_STRING: return json_string(e->s);
    default: return json_null();
  }
}

/* ---- table ---- */

struct ks_cli_table {
  size_t ncols, nlines, cap; /* lines = header + rows */
  char **cells;              /* nlines * ncols; line 0 is the header */
};

static int add_line(ks_cli_table *t, const char *const *cells) {
  if (t->nlines == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 16;
    char **c = realloc(t->cells, ncap * t->ncols * sizeof *c);
    if (!c) return -1;
    t->cells = c;
    t->cap = ncap;
  }
  char **line = t->cells + t->nlines * t->ncols;
  int ok = 1;
  for (size_t j = 0; j < t->ncols; j++) ok &= (line[j] = strdup(cells[j] ? cells[j] : "")) != NULL;
  if (!ok) {
    for (size_t j = 0; j < t->ncols; j++) free(line[j]);
    return -1;
  }
  t->nlines++;
  return 0;
}

ks_cli_table *ks_cli_table_new(size_t ncols, const char *const *headers) {
  ks_cli_table *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ncols = ncols;
  if (add_line(t, headers)) {
    ks_cli_table_free(t);
    return NULL;
  }
  return t;
}

int ks_cli_table_add(ks_cli_table *t, const char *const *cells) { return add_line(t, cells); }

size_t ks_cli_table_rows(const ks_cli_table *t) { return t && t->nlines ? t->nlines - 1 : 0; }

void ks_cli_table_print(const ks_cli_table *t, FILE *out, const char *title) {
  size_t ncols = t->ncols;
  size_t *width = calloc(ncols ? ncols : 1, sizeof *width);
  if (!width) return;
  for (size_t i = 0; i < t->nlines; i++)
    for (size_t j = 0; j < ncols; j++) {
      size_t w = strlen(t->cells[i * t->ncols + j]);
      if (w > width[j]) width[j] = w;
    }
  if (title) fprintf(out, "%s (%zu)\n", title, ks_cli_table_rows(t));
  for (size_t i = 0; i < t->nlines; i++) {
    fputs("  ", out);
    for (size_t j = 0; j < ncols; j++) {
      const char *c = t->cells[i * t->ncols + j];
      if (j + 1 == ncols)
        fprintf(out, "%s\n", c);
      else
        fprintf(out, "%-*s  ", (int)width[j], c);
    }
  }
  free(width);
}

void ks_cli_table_free(ks_cli_table *t) {
  if (!t) return;
  for (size_t i = 0; i < t->nlines * t->ncols; i++) free(t->cells[i]);
  free(t->cells);
  free(t);
}

/* Component path of a key: state/model, state/optimizers/AdamW, state/eval_metrics/eval/F1, rng/0... */
void ks_cli_component_of(const char *key, char *out, size_t cap) {
  static const struct {
    const char *root;
    int segments;
  } roots[] = {{KS_KEY_MODEL, 2},         {KS_KEY_OPTIMIZERS, 3},  {KS_KEY_SCHEDULERS, 3},
               {KS_KEY_CALLBACKS, 3},     {KS_KEY_DATASET_STATE, 3}, {"state/timestamp/", 3},
               {KS_KEY_TRAIN_METRICS, 3}, {KS_KEY_EVAL_METRICS, 4}, {"rng/", 2}};
  int segs = 2;
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++)
    if (!strncmp(key, roots[i].root, strlen(roots[i].root))) segs = roots[i].segments;
  const char *p = key;
  for (int i = 0; i < segs && p; i++) {
    p = strchr(p, '/');
    if (p && i + 1 < segs) p++;
  }
  snprintf(out, cap, "%.*s", p ? (int)(p - key) : (int)strlen(key), key);
}

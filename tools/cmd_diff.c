/*
 * keepsake diff A B [--ignore GLOB]...: key-by-key differences between two
 * files or sharded checkpoint directories (or a file and a directory). Exit 0 when identical
 * in content outside the ignored keys, 1 when they differ, 2 on a bad command line or an
 * unreadable file.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"

typedef struct comp_tally {
  char path[512];
  size_t keys, differ;
} comp_tally;

typedef struct diff_ctx {
  char **ignore;
  int nignore;
  size_t compared, differ, ignored;
  comp_tally *comps; /* per component, in order of first appearance */
  size_t ncomps, capcomps;
  ks_cli_index *by_path; /* component path -> index in comps */
  const char *label;        /* "" or "[rank N] ": printed before each per-rank key */
  const char *const *per_rank; /* the per-rank globs of a sharded checkpoint (NULL: a file) */
  size_t n_per_rank;
  int per_rank_only;        /* ranks after 0: only their per-rank keys (the rest is rank 0's) */
} diff_ctx;

static void diff_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake diff A B [--ignore GLOB]...\n\n"
          "Compares two keepsake or safetensors files key by key: keys missing on either\n"
          "side, dtype or shape changes, how many elements differ and the largest absolute\n"
          "difference, changed scalars and changed metadata. NaN equals NaN in the same place.\n\n"
          "A or B may be a sharded checkpoint directory (a file counts as one rank). The logical\n"
          "state is compared: sharded tensors reassembled, the replicated state, and at equal\n"
          "world sizes every rank's own per-rank state ([rank N]); at different world sizes the\n"
          "states merged onto one rank (metrics merged by their rule).\n"
          "A or B may also be a torch.distributed.checkpoint (torch's FileSystemWriter,\n"
          "read without running its pickle, or keepsake's KeepsakeWriter) or a Hugging\n"
          "Face safetensors layout: its state as 'keepsake convert' imports it, entries\n"
          "named by their path in the saved state dict, so torch's and keepsake's DCP\n"
          "checkpoints of one state compare equal. Metadata that is JSON compares as\n"
          "JSON; what an import read (" KS_META_DCP_IMPORT ") is not compared.\n\n"
          "  --ignore GLOB  skip keys matching GLOB ('*' any run, '?' one byte), or whose\n"
          "                 '/'-prefix matches it ('rng' skips 'rng/torch'); repeatable\n\n"
          "exit status: 0 identical, 1 different, 2 bad command line or unreadable file\n");
}

static int ignored(const diff_ctx *c, const char *key) {
  for (int i = 0; i < c->nignore; i++)
    if (ks_path_match(c->ignore[i], key)) return 1;
  return 0;
}

static int is_per_rank(const diff_ctx *c, const char *key) {
  for (size_t i = 0; i < c->n_per_rank; i++)
    if (ks_path_match(c->per_rank[i], key)) return 1;
  return 0;
}

/* Outside the keys this pass compares (the replicated state is compared on rank 0 only). */
static int skipped(const diff_ctx *c, const char *key) { return c->per_rank_only && !is_per_rank(c, key); }

static const char *label_of(const diff_ctx *c, const char *key) {
  return c->label && is_per_rank(c, key) ? c->label : "";
}

/* An entry under its printed name: the rank label (per-rank entries), then the key. */
static ks_entry shown(const diff_ctx *c, const ks_entry *e, char *buf, size_t cap) {
  ks_entry x = *e;
  if (*label_of(c, e->name)) {
    snprintf(buf, cap, "%s%s", c->label, e->name);
    x.name = buf;
  }
  return x;
}

static int same_element(ks_dtype dt, const uint8_t *a, const uint8_t *b, size_t es, size_t i) {
  if (memcmp(a + i * es, b + i * es, es) == 0) return 1;
  return ks_dtype_is_float(dt) && isnan(ks_dtype_get_f64(dt, a, i)) && isnan(ks_dtype_get_f64(dt, b, i));
}

static int diff_tensor_data(const char *name, const ks_tensor *a, const ks_tensor *b) {
  if (a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0) return 0;
  size_t es = ks_dtype_size(a->dtype), n = a->nbytes / es, differ = 0, nan_mismatch = 0;
  double max_abs = 0;
  for (size_t i = 0; i < n; i++) {
    if (same_element(a->dtype, a->data, b->data, es, i)) continue;
    differ++;
    double d = fabs(ks_dtype_get_f64(a->dtype, a->data, i) - ks_dtype_get_f64(b->dtype, b->data, i));
    if (isnan(d)) nan_mismatch++;
    else if (d > max_abs) max_abs = d;
  }
  if (!differ) return 0;
  printf("~ %s: %zu of %zu elements differ, max abs difference %.9g", ks_cli_esc(name), differ, n, max_abs);
  if (nan_mismatch) printf(" (%zu where only one side is NaN)", nan_mismatch);
  printf("\n");
  return 1;
}

static int diff_tensor(const char *name, const ks_tensor *a, const ks_tensor *b) {
  char sa[160], sb[160];
  if (a->dtype != b->dtype) {
    printf("~ %s: dtype %s -> %s\n", ks_cli_esc(name), ks_dtype_name(a->dtype), ks_dtype_name(b->dtype));
    return 1;
  }
  if (!ks_tensor_same_shape(a, b)) {
    printf("~ %s: shape %s -> %s\n", ks_cli_esc(name), ks_cli_shape(a, sa, sizeof sa), ks_cli_shape(b, sb, sizeof sb));
    return 1;
  }
  return diff_tensor_data(name, a, b);
}

static int same_scalar(const ks_entry *a, const ks_entry *b) {
  if (a->kind != b->kind) return 0;
  switch (a->kind) {
    case KS_VAL_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) == 0 || (isnan(a->f) && isnan(b->f));
    case KS_VAL_STRING: return strcmp(a->s, b->s) == 0;
    case KS_VAL_NULL: return 1;
    default: return a->i == b->i;
  }
}

static int diff_entry(const ks_entry *a, const ks_entry *b) {
  if (a->kind == KS_VAL_TENSOR && b->kind == KS_VAL_TENSOR) return diff_tensor(a->name, &a->tensor, &b->tensor);
  if (same_scalar(a, b)) return 0;
  char va[256], vb[256], sh[160];
  if (a->kind == KS_VAL_TENSOR) snprintf(va, sizeof va, "tensor %s", ks_cli_shape(&a->tensor, sh, sizeof sh));
  else ks_cli_scalar_text(a, va, sizeof va);
  if (b->kind == KS_VAL_TENSOR) snprintf(vb, sizeof vb, "tensor %s", ks_cli_shape(&b->tensor, sh, sizeof sh));
  else ks_cli_scalar_text(b, vb, sizeof vb);
  printf("~ %s: %s -> %s\n", ks_cli_esc(a->name), ks_cli_esc(va), ks_cli_esc(vb));
  return 1;
}

static void describe(const ks_entry *e, char *buf, size_t cap) {
  char sh[160];
  if (e->kind == KS_VAL_TENSOR)
    snprintf(buf, cap, "%s %s", ks_dtype_name(e->tensor.dtype), ks_cli_shape(&e->tensor, sh, sizeof sh));
  else
    ks_cli_scalar_text(e, buf, cap);
}

/* Counts one compared key (and whether it differed) against its component. */
static void tally(diff_ctx *c, const char *key, int differed) {
  char path[512];
  ks_cli_component_of(key, path, sizeof path);
  c->compared++;
  c->differ += (size_t)differed;
  size_t i = c->by_path ? ks_cli_index_get_or_add(c->by_path, path, c->ncomps) : SIZE_MAX;
  if (i == SIZE_MAX) return; /* the per-key lines and totals stay right; only the summary loses a row */
  if (i == c->ncomps) {
    if (c->ncomps == c->capcomps) {
      size_t ncap = c->capcomps ? c->capcomps * 2 : 64;
      comp_tally *t = realloc(c->comps, ncap * sizeof *t);
      if (!t) return;
      c->comps = t, c->capcomps = ncap;
    }
    snprintf(c->comps[i].path, sizeof c->comps[i].path, "%s", path);
    c->comps[i].keys = c->comps[i].differ = 0;
    c->ncomps++;
  }
  c->comps[i].keys++;
  c->comps[i].differ += (size_t)differed;
}

static void print_components(const diff_ctx *c) {
  const char *hdr[] = {"COMPONENT", "KEYS", "DIFFER", "RESULT"};
  ks_cli_table *t = ks_cli_table_new(4, hdr);
  for (size_t i = 0; t && i < c->ncomps; i++) {
    char nk[32], nd[32];
    snprintf(nk, sizeof nk, "%zu", c->comps[i].keys);
    snprintf(nd, sizeof nd, "%zu", c->comps[i].differ);
    const char *cells[] = {c->comps[i].path, nk, nd, c->comps[i].differ ? "different" : "identical"};
    ks_cli_table_add(t, cells);
  }
  if (t) ks_cli_table_print(t, stdout, "\ncomponents");
  ks_cli_table_free(t);
}

static void diff_entries(diff_ctx *c, const ks_statedict *a, const ks_statedict *b) {
  char desc[256], na[1200], nb[1200];
  for (size_t i = 0; i < ks_statedict_count(a); i++) {
    ks_entry ea, eb;
    if (ks_statedict_at(a, i, &ea)) continue; /* index in range: cannot fail */
    if (skipped(c, ea.name)) continue;
    if (ignored(c, ea.name)) { c->ignored++; continue; }
    if (ks_statedict_get(b, ea.name, &eb) == KS_OK) {
      ks_entry sa = shown(c, &ea, na, sizeof na), sb = shown(c, &eb, nb, sizeof nb);
      tally(c, ea.name, diff_entry(&sa, &sb));
      continue;
    }
    describe(&ea, desc, sizeof desc);
    printf("- %s%s: only in A (%s)\n", label_of(c, ea.name), ks_cli_esc(ea.name), ks_cli_esc(desc));
    tally(c, ea.name, 1);
  }
  for (size_t i = 0; i < ks_statedict_count(b); i++) {
    ks_entry ea, eb;
    if (ks_statedict_at(b, i, &eb)) continue; /* index in range: cannot fail */
    if (ks_statedict_get(a, eb.name, &ea) == KS_OK || skipped(c, eb.name)) continue;
    if (ignored(c, eb.name)) { c->ignored++; continue; }
    describe(&eb, desc, sizeof desc);
    printf("+ %s%s: only in B (%s)\n", label_of(c, eb.name), ks_cli_esc(eb.name), ks_cli_esc(desc));
    tally(c, eb.name, 1);
  }
}

/* Metadata that is content: everything but what the writer derives or stamps itself, and what an import
   read (KS_META_DCP_IMPORT: the layout, version and counts of the files, not the state they hold). */
static int meta_is_content(const diff_ctx *c, const char *k) {
  if (c->per_rank_only && strcmp(k, "keepsake.metrics")) return 0; /* the rest is rank 0's, compared once */
  return strcmp(k, KS_META_WRITER) && strcmp(k, KS_META_CHECKSUMS) && strcmp(k, KS_META_SCALARS) &&
         strcmp(k, KS_META_DCP_IMPORT) && !ignored(c, k);
}

/* Two metadata values alike: the same text, or the same JSON value (object members in any order). */
static int same_meta(const char *v, const char *w) {
  if (!strcmp(v, w)) return 1;
  json_t *a = json_loads(v, JSON_DECODE_ANY, NULL), *b = a ? json_loads(w, JSON_DECODE_ANY, NULL) : NULL;
  int same = a && b && json_equal(a, b);
  json_decref(a);
  json_decref(b);
  return same;
}

static void diff_meta_side(diff_ctx *c, const ks_meta *x, const ks_meta *y, const char *sign, const char *side) {
  for (size_t i = 0; i < ks_meta_count(x); i++) {
    const char *k, *v, *w;
    if (ks_meta_at(x, i, &k, &v)) continue; /* index in range: cannot fail */
    if (!meta_is_content(c, k)) continue;
    w = ks_meta_get(y, k);
    if (w && *sign == '+') continue; /* pairs on both sides are compared in the first pass */
    if (!w) {
      printf("%s %smetadata '%s': only in %s\n", sign, c->per_rank_only ? c->label : "", ks_cli_esc(k), side);
      c->differ++;
    } else if (!same_meta(v, w)) {
      printf("~ %smetadata '%s': values differ (%zu bytes -> %zu bytes)\n", c->per_rank_only ? c->label : "",
             ks_cli_esc(k), strlen(v), strlen(w));
      c->differ++;
    }
  }
}

/* One side: a file (one rank) or a sharded directory, as `n` per-rank state dicts. */
typedef struct side {
  int n;
  ks_statedict **sd;
  ks_meta **meta;
  ks_shard_index *idx;
} side;

static void side_free(side *x) {
  for (int r = 0; r < x->n; r++) {
    if (x->sd) ks_statedict_free(x->sd[r]);
    if (x->meta) ks_meta_free(x->meta[r]);
  }
  free(x->sd);
  free(x->meta);
  ks_shard_index_free(x->idx);
  memset(x, 0, sizeof *x);
}

/* The sharded checkpoint `in` as its ranks (merge = 1: merged onto one rank), verified first. */
KS_NODISCARD static ks_status dir_load(const ks_cli_input *in, int merge, side *x, ks_error *err) {
  /* Every read through read_io: a local rank file is read, never mapped (copy mode). */
  ks_status s = ks_shard_index_read(in->path, NULL, in->read_io, &x->idx, err);
  int world = ks_cli_shard_info(x->idx).world_size;
  for (int f = 0; !s && f < world; f++) s = ks_shard_verify_file(in->path, x->idx, f, in->read_io, err);
  if (!s) /* the index against every file */
    s = ks_shard_check(in->path, x->idx, in->read_io, KS_SHARD_CHECK_HEADERS, NULL, NULL, err);
  if (s) return s;
  x->n = merge ? 1 : world;
  x->sd = calloc((size_t)x->n, sizeof *x->sd);
  x->meta = calloc((size_t)x->n, sizeof *x->meta);
  if (!x->sd || !x->meta) return KS_E_NOMEM;
  ks_shard_load_opts lo = {.no_verify = 1, .io = in->read_io};
  for (int r = 0; !s && r < x->n; r++)
    s = ks_shard_load_rank(in->path, x->idx, r, x->n, NULL, &lo, &x->sd[r], &x->meta[r], err);
  return s;
}

/* A directory read by the import (torch DCP, KeepsakeWriter's, Hugging Face): one state, verified. */
KS_NODISCARD static ks_status import_load(const ks_cli_input *in, side *x, ks_error *err) {
  x->n = 1;
  x->sd = calloc(1, sizeof *x->sd);
  x->meta = calloc(1, sizeof *x->meta);
  if (!x->sd || !x->meta) return KS_E_NOMEM;
  return ks_cli_import(in, 1, &x->sd[0], &x->meta[0], err);
}

static int imported(ks_cli_dir_kind k) { return k != KS_CLI_DIR_SHARDED; }

/* The checkpoint at path as n ranks (a file is one); merge = 1 loads a directory merged onto one rank. */
KS_NODISCARD static ks_status side_load(const char *path, int merge, side *x, ks_error *err) {
  memset(x, 0, sizeof *x);
  ks_read_opts ro = ks_cli_read_opts();
  if (!ks_cli_is_dir(path)) {
    x->n = 1;
    x->sd = calloc(1, sizeof *x->sd);
    x->meta = calloc(1, sizeof *x->meta);
    if (!x->sd || !x->meta) return KS_E_NOMEM;
    return ks_load(path, &ro, &x->sd[0], &x->meta[0], err);
  }
  ks_cli_input in; /* a local directory, s3:// or http(s):// */
  if (ks_cli_input_open("diff", path, &in)) { /* it printed why */
    snprintf(err->message, sizeof err->message, "cannot open the location");
    snprintf(err->file, sizeof err->file, "%s", path);
    return err->code = KS_E_INVALID;
  }
  ks_status s = imported(ks_cli_dir_kind_of(&in)) ? import_load(&in, x, err) : dir_load(&in, merge, x, err);
  if (s) ks_cli_input_error(&in, err);
  ks_cli_input_close(&in);
  return s;
}

/* Ranks compared: a sharded directory's world size; 1 for a file and for a directory read as one state. */
static int world_of(const char *path) {
  ks_shard_index *idx = NULL;
  ks_cli_input in;
  int n = 1;
  if (!ks_cli_is_dir(path) || ks_cli_input_open("diff", path, &in)) return 1;
  if (!imported(ks_cli_dir_kind_of(&in)) && !ks_shard_index_read(in.path, NULL, in.read_io, &idx, NULL))
    n = ks_cli_shard_info(idx).world_size;
  ks_shard_index_free(idx);
  ks_cli_input_close(&in);
  return n;
}

static void diff_one(diff_ctx *c, const ks_statedict *a, const ks_statedict *b, const ks_meta *ma, const ks_meta *mb) {
  diff_entries(c, a, b);
  diff_meta_side(c, ma, mb, "-", "A");
  diff_meta_side(c, mb, ma, "+", "B");
}

/* Rank by rank at equal world sizes (rank 0 everything, the others their per-rank entries), else merged. */
static int diff_sides(diff_ctx *c, const char *pa, const char *pb) {
  int wa = world_of(pa), wb = world_of(pb), merge = wa != wb;
  side a = {0}, b = {0}; /* both freed when either fails to load */
  ks_error err;
  ks_error_clear(&err);
  int rc = KS_EXIT_USAGE;
  if (side_load(pa, merge, &a, &err) || side_load(pb, merge, &b, &err)) {
    ks_cli_print_error(stderr, "diff", &err);
    side_free(&a);
    side_free(&b);
    return rc;
  }
  if (merge) printf("world sizes differ (%d -> %d): comparing the states merged onto one rank\n", wa, wb);
  size_t np = 0;
  const char *const *pr = ks_shard_default_per_rank(&np);
  if (a.idx) {
    np = ks_cli_shard_info(a.idx).n_per_rank;
    pr = ks_cli_shard_info(a.idx).per_rank;
  }
  char label[32];
  c->per_rank = pr;
  c->n_per_rank = np;
  for (int r = 0; r < a.n; r++) {
    snprintf(label, sizeof label, "[rank %d] ", r);
    c->label = a.n > 1 ? label : NULL;
    c->per_rank_only = r > 0;
    diff_one(c, a.sd[r], b.sd[r], a.meta[r], b.meta[r]);
  }
  c->label = NULL;
  c->per_rank_only = 0;
  print_components(c);
  printf("%s: %zu keys compared, %zu differ, %zu ignored\n", c->differ ? "different" : "identical", c->compared,
         c->differ, c->ignored);
  rc = c->differ ? KS_EXIT_BAD : KS_EXIT_OK;
  side_free(&a);
  side_free(&b);
  return rc;
}

static int diff_files(diff_ctx *c, const char *pa, const char *pb) {
  ks_statedict *a = NULL, *b = NULL;
  ks_meta *ma = NULL, *mb = NULL;
  ks_error err;
  int rc = KS_EXIT_USAGE;
  ks_cli_input ia, ib; /* copy mode: a file truncated meanwhile is an error, not SIGBUS */
  if (ks_cli_input_open("diff", pa, &ia)) return KS_EXIT_USAGE;
  if (ks_cli_input_open("diff", pb, &ib)) return ks_cli_input_close(&ia), KS_EXIT_USAGE;
  c->by_path = ks_cli_index_new();
  ks_status st = ks_load(ia.path, &ia.ro, &a, &ma, &err);
  if (st) ks_cli_input_error(&ia, &err);
  else if ((st = ks_load(ib.path, &ib.ro, &b, &mb, &err)) != KS_OK) ks_cli_input_error(&ib, &err);
  ks_cli_input_close(&ia);
  ks_cli_input_close(&ib);
  if (st) {
    ks_cli_print_error(stderr, "diff", &err);
  } else {
    diff_entries(c, a, b);
    diff_meta_side(c, ma, mb, "-", "A");
    diff_meta_side(c, mb, ma, "+", "B");
    print_components(c);
    printf("%s: %zu keys compared, %zu differ, %zu ignored\n", c->differ ? "different" : "identical", c->compared,
           c->differ, c->ignored);
    rc = c->differ ? KS_EXIT_BAD : KS_EXIT_OK;
  }
  ks_statedict_free(a);
  ks_statedict_free(b);
  ks_meta_free(ma);
  ks_meta_free(mb);
  ks_cli_index_free(c->by_path);
  return rc;
}

int ks_cmd_diff(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) return diff_usage(stdout), KS_EXIT_OK;
  diff_ctx c = {0};
  const char *paths[2];
  int npaths = 0;
  c.ignore = calloc((size_t)argc, sizeof *c.ignore);
  if (!c.ignore) return fprintf(stderr, "keepsake diff: out of memory\n"), KS_EXIT_USAGE;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ignore") && i + 1 < argc) {
      c.ignore[c.nignore++] = argv[++i];
    } else if (!strncmp(argv[i], "--ignore=", 9)) {
      c.ignore[c.nignore++] = argv[i] + 9;
    } else if ((argv[i][0] == '-' && argv[i][1]) || npaths == 2) {
      fprintf(stderr, "keepsake diff: unexpected argument '%s'\n", ks_cli_esc(argv[i]));
      free(c.ignore);
      return diff_usage(stderr), KS_EXIT_USAGE;
    } else {
      paths[npaths++] = argv[i];
    }
  }
  int rc = KS_EXIT_USAGE;
  if (npaths == 2 && (ks_cli_is_dir(paths[0]) || ks_cli_is_dir(paths[1]))) {
    c.by_path = ks_cli_index_new();
    rc = diff_sides(&c, paths[0], paths[1]);
    ks_cli_index_free(c.by_path);
  } else if (npaths == 2)
    rc = diff_files(&c, paths[0], paths[1]);
  else diff_usage(stderr);
  free(c.ignore);
  free(c.comps);
  return rc;
}

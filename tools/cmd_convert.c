/* keepsake convert IN OUT: between torch.save / Composer files and keepsake files. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "commands.h"
#include "convert_input.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"

#include <jansson.h>

static void convert_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake convert IN OUT [--ignore GLOB]... [--salvage] [--torch-compat 1.13]\n\n"
          "Converts a checkpoint. The input type is detected from its bytes: a zip archive\n"
          "is a torch.save / Composer file (read without executing any pickled code),\n"
          "anything else a keepsake or safetensors file. The direction follows OUT's name:\n"
          "  OUT ending in .pt or .pth   torch.save-compatible file that\n"
          "                              torch.load(OUT, weights_only=True) accepts\n"
          "  any other name              keepsake file\n\n"
          "Entries are named by their '/'-joined path in the pickled structure, e.g.\n"
          "state/optimizers/AdamW/state/0/exp_avg. Composer metrics of both layouts\n"
          "(pickled torchmetrics objects, or {state_dict, _computed}) are written as\n"
          "<metric>/state_dict/<state> and <metric>/_computed, and described in the\n"
          "metadata key " KS_META_COMPOSER_METRICS ". The metadata key " KS_META_METRICS "\n"
          "gives each metric's catalogue class, its arguments when the checkpoint\n"
          "records them, its state schema version and update count, so that\n"
          "keepsake's state loader fills the program's metrics by name.\n\n"
          "Lists, tuples, sets, int/bool/None/float dict keys and empty containers of a\n"
          "torch file are recorded in the metadata key " KS_TORCH_STRUCTURE_META ", and a\n"
          ".pt export rebuilds them, so it loads into AdamW, schedulers and RNG setters\n"
          "as the original did ('/' and '%%' inside keys appear in names as %%2F, %%25).\n\n"
          "  --ignore GLOB  leave out entries matching GLOB ('*' any run, '?' one byte), or\n"
          "                 whose '/'-prefix matches it ('rng' drops 'rng/0/...'); repeatable\n"
          "  --salvage      convert even when the input fails its integrity checks, after\n"
          "                 printing each problem ('salvaged despite: ...') to stderr\n"
          "  --torch-compat 1.13  a .pt that torch 1.13's weights_only loader reads: floats\n"
          "                 as 0-d float64 tensors, uint16/32/64 widened, float8 refused\n\n"
          "The input's integrity is checked before anything is written: every keepsake\n"
          "checksum, every zip entry's CRC32. A mismatch stops the conversion (exit 1)\n"
          "unless --salvage is given. The input is read into memory, never mapped.\n"
          "OUT is replaced atomically when it is absent or a writable regular file; an\n"
          "OUT that is a symbolic link (not followed), directory, device, FIFO, socket\n"
          "or read-only file is refused and left as it is.\n\n"
          "exit status: 0 converted, 1 the input could not be read or OUT not written,\n"
          "2 bad command line\n");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static int is_zip_file(const ks_cli_input *in) {
  unsigned char head[4] = {0};
  size_t n = ks_cli_input_head(in, head, sizeof head);
  return n > 0 && ks_torch_is_zip(head, n);
}

/* torch's legacy format: read by the import only to be refused with a message that names it. */
static int is_legacy_torch(const ks_cli_input *in) {
  unsigned char head[14] = {0};
  size_t n = ks_cli_input_head(in, head, sizeof head);
  return n > 0 && ks_torch_is_legacy(head, n);
}

/* Keeps the caller's metadata pairs of a keepsake/safetensors input; the writer owns its own keys. */
static ks_status keep_meta(const ks_meta *meta, ks_meta *extra) {
  const char *k, *v;
  for (size_t i = 0; meta && ks_meta_at(meta, i, &k, &v) == KS_OK; i++) {
    if (!strcmp(k, KS_META_FORMAT) || !strcmp(k, KS_META_FORMAT_VERSION) || !strcmp(k, KS_META_WRITER) ||
        !strcmp(k, KS_META_SCALARS) || !strcmp(k, KS_META_CHECKSUMS))
      continue;
    ks_status st = ks_meta_set(extra, k, v);
    if (st) return st;
  }
  return KS_OK;
}

/* The entries of src that no glob ignores, borrowing src's tensor data (src must outlive *out). */
static ks_status without_ignored(const ks_statedict *src, char **globs, int nglobs, ks_statedict **out) {
  ks_statedict *dst;
  ks_status st = ks_statedict_create(NULL, &dst);
  ks_entry e;
  for (size_t i = 0; !st && ks_statedict_at(src, i, &e) == KS_OK; i++) {
    int drop = 0;
    for (int g = 0; g < nglobs && !drop; g++) drop = ks_path_match(globs[g], e.name);
    if (!drop) st = ks_statedict_set_entry(dst, e.name, &e, KS_BORROW);
  }
  if (st) {
    ks_statedict_free(dst);
    return st;
  }
  *out = dst;
  return KS_OK;
}

/* The structure document without the containers that --ignore drops, kept in extra and in *out
   (malloc'd; NULL when there is none). */
static ks_status structure_without_ignored(ks_meta *extra, char **globs, int nglobs, char **out) {
  const char *text = ks_meta_get(extra, KS_TORCH_STRUCTURE_META);
  *out = NULL;
  if (!text) return KS_OK;
  json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
  json_t *containers = json_object_get(doc, "containers");
  const char *path;
  json_t *v, *tmp;
  json_object_foreach_safe(containers, tmp, path, v) {
    int drop = 0;
    for (int g = 0; g < nglobs && !drop; g++) drop = *path && ks_path_match(globs[g], path);
    if (drop) json_object_del(containers, path);
  }
  *out = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup(text); /* a bad one: the writer says so */
  json_decref(doc);
  if (!*out) return KS_E_NOMEM;
  return ks_meta_set(extra, KS_TORCH_STRUCTURE_META, *out); /* a keepsake output keeps the same view */
}

static int convert(const ks_cli_input *src, const ks_cli_input *dst, char **globs, int nglobs, int salvage,
                   int compat) {
  ks_error err;
  const char *in = src->arg, *out = dst->arg;
  if (!dst->io && ks_cli_check_output("convert", out)) return KS_EXIT_BAD;
  ks_statedict *sd = NULL;
  ks_error_clear(&err);
  ks_meta *meta = NULL, *extra = NULL;
  ks_status st = KS_OK;
  if (is_zip_file(src) || is_legacy_torch(src)) {
    st = ks_convert_read_torch(src, salvage, &sd, &extra, &err); /* the library's import, nothing added */
  } else if (!(st = ks_meta_create(NULL, &extra)) &&
             (st = ks_convert_read_keepsake(src, salvage, &sd, &meta, &err)) == KS_OK) {
    st = keep_meta(meta, extra);
  }
  ks_statedict *kept = NULL;
  char *structure = NULL;
  if (!st) st = without_ignored(sd, globs, nglobs, &kept);
  if (!st) st = structure_without_ignored(extra, globs, nglobs, &structure);
  if (st && !err.code) {
    err.code = st;
    snprintf(err.message, sizeof err.message, "%s", ks_strerror(st));
  }
  if (st) {
    ks_cli_print_error(stderr, "convert", &err);
    if (st == KS_E_CHECKSUM && !salvage)
      fprintf(stderr, "keepsake convert: the input failed its integrity check; nothing was written "
                      "(--salvage converts it anyway)\n");
  } else if (ends_with(out, ".pt") || ends_with(out, ".pth")) {
    ks_torch_write_opts wo = {0};
    wo.torch_compat = compat;
    wo.structure = structure;
    wo.io = dst->io;
    if ((st = ks_torch_save(dst->path, kept, &wo, &err))) ks_cli_input_error(dst, &err), ks_cli_print_error(stderr, "convert", &err);
  } else {
    ks_save_opts so = {0};
    so.io = dst->io;
    if ((st = ks_save(dst->path, kept, extra, &so, &err))) ks_cli_input_error(dst, &err), ks_cli_print_error(stderr, "convert", &err);
  }
  if (!st)
    printf("%s -> %s: %zu entries (%zu ignored)\n", ks_cli_esc(in), ks_cli_esc(out), ks_statedict_count(kept),
           ks_statedict_count(sd) - ks_statedict_count(kept));
  free(structure);
  ks_statedict_free(kept);
  ks_statedict_free(sd);
  ks_meta_free(meta);
  ks_meta_free(extra);
  return st ? KS_EXIT_BAD : KS_EXIT_OK;
}

int ks_cmd_convert(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) {
    convert_usage(stdout);
    return KS_EXIT_OK;
  }
  char **globs = calloc((size_t)argc, sizeof *globs);
  const char *paths[2] = {NULL, NULL};
  int nglobs = 0, npaths = 0, bad = !globs, salvage = 0, compat = 0;
  for (int i = 1; i < argc && !bad; i++) {
    if (!strcmp(argv[i], "--torch-compat") && i + 1 < argc)
      compat = !strcmp(argv[++i], "1.13") ? KS_TORCH_COMPAT_1_13 : (bad = 1, 0);
    else if (!strcmp(argv[i], "--torch-compat=1.13"))
      compat = KS_TORCH_COMPAT_1_13;
    else if (!strcmp(argv[i], "--ignore") && i + 1 < argc)
      globs[nglobs++] = argv[++i];
    else if (!strncmp(argv[i], "--ignore=", 9))
      globs[nglobs++] = argv[i] + 9;
    else if (!strcmp(argv[i], "--salvage"))
      salvage = 1;
    else if ((argv[i][0] == '-' && argv[i][1]) || npaths == 2)
      bad = 1;
    else
      paths[npaths++] = argv[i];
  }
  int rc = KS_EXIT_USAGE;
  if (bad || npaths != 2)
    convert_usage(stderr);
  else {
    ks_cli_input src, dst; /* local paths or storage URLs (s3://, http(s):// for the input) */
    if (!ks_cli_input_open("convert", paths[0], &src)) {
      rc = ks_cli_input_open("convert", paths[1], &dst) ? KS_EXIT_BAD
                                                        : convert(&src, &dst, globs, nglobs, salvage, compat);
      if (dst.st) ks_cli_input_close(&dst);
      ks_cli_input_close(&src);
    } else
      rc = KS_EXIT_BAD;
  }
  free(globs);
  return rc;
}

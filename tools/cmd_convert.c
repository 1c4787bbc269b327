/* keepsake convert IN OUT: between torch.save / Composer files and keepsake files. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"
#include "keepsake/convert.h"
#include "keepsake/layout.h"
#include "keepsake/torch.h"

static void convert_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake convert IN OUT [--ignore GLOB]... [--salvage] [--torch-compat 1.13]\n"
          "                               [--hf [--hf-shard-size BYTES]]\n\n"
          "Converts a checkpoint. The input type is detected from its bytes: a zip archive\n"
          "is a torch.save / Composer file (read without executing any pickled code),\n"
          "anything else a keepsake or safetensors file. A directory is one of:\n"
          "  a torch.distributed.checkpoint (.metadata, dcp.save with FileSystemWriter):\n"
          "    tensors assembled from their chunks, plain non-tensor values kept, other\n"
          "    objects left out (listed in the metadata key " KS_META_DCP_IMPORT ")\n"
          "  a DCP checkpoint keepsake.distributed.KeepsakeWriter wrote: the same state,\n"
          "    named alike, every file verified against its index and checksums\n"
          "  a Hugging Face safetensors layout: model.safetensors.index.json (weight_map)\n"
          "    and its files, or every *.safetensors file (HuggingFaceStorageWriter's too)\n"
          "Entries of a DCP checkpoint are named by their path in the state dict that was\n"
          "saved (planner_data), as a torch.save file of it: model/emb.weight.\n"
          "The direction follows OUT's name:\n"
          "  OUT ending in .pt or .pth   torch.save-compatible file that\n"
          "                              torch.load(OUT, weights_only=True) accepts\n"
          "  any other name              keepsake file\n"
          "  --hf: OUT is a directory (absent or empty) in the Hugging Face layout that\n"
          "    torch's HuggingFaceStorageReader and transformers' from_pretrained read:\n"
          "    model.safetensors, or model-0000i-of-0000N.safetensors and\n"
          "    model.safetensors.index.json (weight_map), written last. Tensors whole,\n"
          "    named as DCP names them (model/emb.weight -> model.emb.weight); each file\n"
          "    a keepsake file with its tensors' checksums; scalars in the first.\n\n"
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
          "as the original did ('/' and '%%' inside keys appear in names as %%2F, %%25).\n"
          "Metric list (\"cat\") states, which keepsake stores joined along dim 0, are\n"
          "exported as one-item lists, so torchmetrics' load_state_dict and update() take them.\n\n"
          "  --ignore GLOB  leave out entries matching GLOB ('*' any run, '?' one byte), or\n"
          "                 whose '/'-prefix matches it ('rng' drops 'rng/0/...'); repeatable\n"
          "  --salvage      convert even when the input fails its integrity checks, after\n"
          "                 printing each problem ('salvaged despite: ...') to stderr\n"
          "  --torch-compat 1.13  a .pt that torch 1.13's weights_only loader reads: floats\n"
          "                 as 0-d float64 tensors, uint16/32/64 widened, float8 refused\n"
          "  --hf           write the Hugging Face layout into the directory OUT\n"
          "  --hf-shard-size BYTES  most tensor bytes per file of --hf (default 5000000000)\n\n"
          "The input's integrity is checked before anything is written: every keepsake\n"
          "checksum, every zip entry's CRC32. A mismatch stops the conversion (exit 1)\n"
          "unless --salvage is given. The input is read into memory, never mapped.\n"
          "OUT is replaced atomically when it is absent or a writable regular file; an\n"
          "OUT that is a symbolic link (not followed), directory, device, FIFO, socket\n"
          "or read-only file is refused and left as it is.\n\n"
          "exit status: 0 converted, 1 the input could not be read or OUT not written,\n"
          "2 bad command line\n");
}

static void print_warnings(const ks_convert_report *rep) {
  size_t n = ks_convert_report_warning_count(rep);
  for (size_t i = 0; i < n; i++) {
    const ks_error *w = ks_convert_report_warning(rep, i);
    if (w) ks_cli_print_error(stderr, "convert: salvaged despite", w);
  }
  if (n > KS_CONVERT_MAX_WARNINGS)
    fprintf(stderr, "keepsake convert: salvaged despite %zu more problems\n", n - KS_CONVERT_MAX_WARNINGS);
}

/* The library's conversion (convert.h), nothing added: this prints what it reports. */
typedef struct hf_opts {
  int on;
  uint64_t shard_bytes;
} hf_opts;

static int convert(const ks_cli_input *src, const ks_cli_input *dst, const char *const *globs, int nglobs, int salvage,
                   int compat, hf_opts hf) {
  const char *in = src->arg, *out = dst->arg;
  ks_convert_opts o = {0};
  o.size = sizeof o;
  o.in_io = src->io; /* NULL for local files; a storage location's table for s3:// and http(s):// */
  o.io = dst->io;
  o.ignore = globs;
  o.n_ignore = (size_t)nglobs;
  o.salvage = salvage;
  o.torch_compat = compat;
  o.hf = hf.on;
  o.hf_shard_bytes = hf.shard_bytes;
  ks_convert_report *rep = NULL;
  ks_error err;
  ks_error_clear(&err);
  ks_status st = ks_convert(src->path, dst->path, &o, &rep, &err);
  print_warnings(rep);
  if (st) {
    ks_cli_input_error(dst->io && !strcmp(err.file, dst->path) ? dst : src, &err); /* name the URL given */
    ks_cli_print_error(stderr, "convert", &err);
    if (st == KS_E_CHECKSUM && !salvage)
      fprintf(stderr, "keepsake convert: the input failed its integrity check; nothing was written "
                      "(--salvage converts it anyway)\n");
  } else {
    printf("%s -> %s: %zu entries (%zu ignored)\n", ks_cli_esc(in), ks_cli_esc(out), ks_convert_report_written(rep),
           ks_convert_report_ignored(rep));
  }
  ks_convert_report_free(rep);
  return st ? KS_EXIT_BAD : KS_EXIT_OK;
}

/* A positive decimal byte count; nonzero when s is not one. */
static int parse_bytes(const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-' || v == 0) return 1;
  *out = (uint64_t)v;
  return 0;
}

int ks_cmd_convert(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) {
    convert_usage(stdout);
    return KS_EXIT_OK;
  }
  const char **globs = calloc((size_t)argc, sizeof *globs);
  const char *paths[2] = {NULL, NULL};
  int nglobs = 0, npaths = 0, bad = !globs, salvage = 0, compat = 0;
  hf_opts hf = {0, 0};
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
    else if (!strcmp(argv[i], "--hf"))
      hf.on = 1;
    else if (!strcmp(argv[i], "--hf-shard-size") && i + 1 < argc)
      bad = parse_bytes(argv[++i], &hf.shard_bytes);
    else if ((argv[i][0] == '-' && argv[i][1]) || npaths == 2)
      bad = 1;
    else
      paths[npaths++] = argv[i];
  }
  int rc = KS_EXIT_USAGE;
  if (bad || npaths != 2 || (hf.shard_bytes && !hf.on) || (hf.on && compat))
    convert_usage(stderr);
  else {
    ks_cli_input src, dst; /* local paths or storage URLs (s3://, http(s):// for the input) */
    if (!ks_cli_input_open("convert", paths[0], &src)) {
      rc = ks_cli_input_open("convert", paths[1], &dst) ? KS_EXIT_BAD
                                                        : convert(&src, &dst, globs, nglobs, salvage, compat, hf);
      if (dst.st) ks_cli_input_close(&dst);
      ks_cli_input_close(&src);
    } else {
      rc = KS_EXIT_BAD;
    }
  }
  free(globs);
  return rc;
}

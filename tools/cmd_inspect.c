/* keepsake inspect FILE [--json]: tensors, scalars and metadata of a file. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "commands.h"

static void inspect_usage(FILE *out) {
  fprintf(out,
          "usage: keepsake inspect FILE|DIR [--json]\n\n"
          "Shows the tensors (name, dtype, shape, bytes), scalars and metadata of a keepsake\n"
          "or safetensors file. The file's structure is validated; checksums are not (use\n"
          "'keepsake verify'). DIR, a sharded checkpoint directory, shows its index; with\n"
          "--json also each rank file as FILE --json shows it (\"files\"). A torch\n"
          "distributed checkpoint (.metadata, never run) or a Hugging Face safetensors layout\n"
          "shows what the import reads: its tensors, values and sizes.\n\n"
          "  --json   print the same information as one JSON object\n"
          "  --help   show this help\n");
}

static int is_writer_key(const char *k) {
  return !strcmp(k, KS_META_SCALARS) || !strcmp(k, KS_META_CHECKSUMS) || !strcmp(k, KS_META_FORMAT) ||
         !strcmp(k, KS_META_FORMAT_VERSION) || !strcmp(k, KS_META_WRITER);
}

static uint64_t total_bytes(const ks_reader *r) { return ks_reader_file_size(r) - ks_reader_data_offset(r); }

int ks_inspect_summary(const ks_reader *r, FILE *out, json_t *json) {
  const char *writer = ks_meta_get(ks_reader_meta(r), KS_META_WRITER);
  int v = ks_reader_format_version(r);
  if (json) {
    json_object_set_new(json, "file", json_string(ks_reader_path(r)));
    json_object_set_new(json, "format", json_string(v ? "keepsake" : "safetensors"));
    json_object_set_new(json, "format_version", v ? json_integer(v) : json_null());
    json_object_set_new(json, "writer", writer ? json_string(writer) : json_null());
    json_object_set_new(json, "file_bytes", json_integer((json_int_t)ks_reader_file_size(r)));
    json_object_set_new(json, "header_bytes", json_integer((json_int_t)ks_reader_data_offset(r)));
    return 0;
  }
  fprintf(out, "file:    %s\n", ks_cli_esc(ks_reader_path(r)));
  if (v)
    fprintf(out, "format:  keepsake version %d (written by %s)\n", v, writer ? ks_cli_esc(writer) : "unknown writer");
  else
    fprintf(out, "format:  safetensors (no keepsake metadata)\n");
  fprintf(out, "size:    %" PRIu64 " bytes (%" PRIu64 " header, %" PRIu64 " data in %zu tensors)\n\n",
          ks_reader_file_size(r), ks_reader_data_offset(r), total_bytes(r), ks_reader_count(r));
  return 0;
}

static json_t *tensor_json(const char *name, const ks_tensor *t, const ks_tensor_info *info) {
  json_t *shape = json_array();
  for (int d = 0; d < t->rank; d++) json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
  return json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", name, "dtype", ks_dtype_name(t->dtype), "shape", shape,
                   "bytes", (json_int_t)t->nbytes, "offset", (json_int_t)info->begin);
}

int ks_inspect_tensors(const ks_reader *r, FILE *out, json_t *json) {
  static const char *const head[] = {"NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"};
  json_t *arr = json ? json_array() : NULL;
  ks_cli_table *t = json ? NULL : ks_cli_table_new(5, head);
  if (!json && !t) return fprintf(stderr, "keepsake inspect: out of memory\n"), -1;
  for (size_t i = 0; i < ks_reader_count(r); i++) {
    const char *name;
    ks_tensor v;
    ks_tensor_info info;
    if (ks_reader_tensor_at(r, i, &name, &v)) continue; /* index in range: cannot fail */
    if (ks_reader_tensor_info(r, i, &info)) continue; /* index in range: cannot fail */
    if (arr) {
      json_array_append_new(arr, tensor_json(name, &v, &info));
      continue;
    }
    char shape[160], bytes[24], off[24];
    snprintf(bytes, sizeof bytes, "%zu", v.nbytes);
    snprintf(off, sizeof off, "%" PRIu64, info.begin);
    const char *row[] = {name, ks_dtype_name(v.dtype), ks_cli_shape(&v, shape, sizeof shape), bytes, off};
    ks_cli_table_add(t, row);
  }
  if (arr) return json_object_set_new(json, "tensors", arr), 0;
  ks_cli_table_print(t, out, "tensors");
  ks_cli_table_free(t);
  return 0;
}

static const char *kind_name(ks_value_kind k) {
  static const char *const names[] = {"tensor", "int", "float", "bool", "string", "null"};
  return (unsigned)k < 6 ? names[k] : "?";
}

int ks_inspect_scalars(const ks_reader *r, FILE *out, json_t *json) {
  ks_statedict *sd;
  ks_error err;
  if (ks_statedict_create(NULL, &sd, NULL)) return fprintf(stderr, "keepsake inspect: out of memory\n"), -1;
  int rc = 0;
  if (ks_reader_scalars(r, sd, &err)) {
    ks_cli_print_error(stderr, "inspect", &err);
    rc = -1;
  } else if (json) {
    json_t *obj = json_object();
    for (size_t i = 0; i < ks_statedict_count(sd); i++) {
      ks_entry e;
      if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
      json_object_set_new(obj, e.name, ks_cli_scalar_json(&e));
    }
    json_object_set_new(json, "scalars", obj);
  } else if (ks_statedict_count(sd)) {
    static const char *const head[] = {"NAME", "TYPE", "VALUE"};
    ks_cli_table *t = ks_cli_table_new(3, head);
    for (size_t i = 0; t && i < ks_statedict_count(sd); i++) {
      ks_entry e;
      char val[512];
      if (ks_statedict_at(sd, i, &e)) continue; /* index in range: cannot fail */
      const char *row[] = {e.name, kind_name(e.kind), ks_cli_scalar_text(&e, val, sizeof val)};
      ks_cli_table_add(t, row);
    }
    if (t) fputc('\n', out), ks_cli_table_print(t, out, "scalars");
    ks_cli_table_free(t);
  }
  ks_statedict_free(sd);
  return rc;
}

static int shown_in_metadata(const char *k) {
  if (is_writer_key(k)) return 0;
  return !(ks_inspect_component_owns_key && ks_inspect_component_owns_key(k));
}

int ks_inspect_metadata(const ks_reader *r, FILE *out, json_t *json) {
  const ks_meta *m = ks_reader_meta(r);
  json_t *obj = json ? json_object() : NULL;
  size_t shown = 0;
  for (size_t i = 0; i < ks_meta_count(m); i++) {
    const char *k, *v;
    if (ks_meta_at(m, i, &k, &v)) continue; /* index in range: cannot fail */
    if (!shown_in_metadata(k)) continue;
    if (obj) {
      json_object_set_new(obj, k, json_string(v));
      continue;
    }
    fprintf(out, "%s  %s: %s\n", shown++ ? "" : "\nmetadata\n", ks_cli_esc(k), ks_cli_esc(v));
  }
  if (obj) json_object_set_new(json, "metadata", obj);
  return 0;
}

/* The sections of an open file, as text on stdout or into json. */
static int sections(const ks_reader *r, json_t *json) {
  int rc = ks_inspect_summary(r, stdout, json);
  if (!rc) rc = ks_inspect_tensors(r, stdout, json);
  if (!rc) rc = ks_inspect_scalars(r, stdout, json);
  if (!rc) rc = ks_inspect_metadata(r, stdout, json);
  if (!rc && ks_inspect_components) rc = ks_inspect_components(r, stdout, json);
  return rc;
}

/* Opens path (a local file or a storage URL) in copy mode: a file truncated meanwhile is an error, not SIGBUS. */
static int open_input(const char *path, ks_reader **r) {
  ks_error err;
  ks_cli_input in;
  if (ks_cli_input_open("inspect", path, &in)) return -1;
  ks_status st = ks_reader_open(in.path, &in.ro, r, &err);
  if (st) ks_cli_input_error(&in, &err);
  ks_cli_input_close(&in); /* the file is in memory now */
  if (st) ks_cli_print_error(stderr, "inspect", &err);
  return st ? -1 : 0;
}

int ks_inspect_file_json(const char *path, json_t **out) {
  ks_reader *r;
  *out = NULL;
  if (open_input(path, &r)) return -1;
  json_t *json = json_object();
  int rc = json ? sections(r, json) : -1;
  ks_reader_free(r);
  if (rc) json_decref(json);
  else *out = json;
  return rc;
}

int ks_cli_print_json(json_t *json) {
  char *s = json_dumps(json, JSON_INDENT(2));
  if (s) puts(s);
  free(s);
  return s ? 0 : -1;
}

static int inspect_file(const char *path, int as_json) {
  int rc;
  if (as_json) {
    json_t *json;
    rc = ks_inspect_file_json(path, &json);
    if (!rc) rc = ks_cli_print_json(json);
    json_decref(json);
  } else {
    ks_reader *r;
    if (open_input(path, &r)) return KS_EXIT_BAD;
    rc = sections(r, NULL);
    ks_reader_free(r);
  }
  return rc ? KS_EXIT_BAD : KS_EXIT_OK;
}

int ks_cmd_inspect(int argc, char **argv) {
  if (ks_cli_wants_help(argc, argv)) return inspect_usage(stdout), KS_EXIT_OK;
  const char *path = NULL;
  int as_json = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      as_json = 1;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "keepsake inspect: unknown option '%s'\n", argv[i]);
      return inspect_usage(stderr), KS_EXIT_USAGE;
    } else if (path) {
      fprintf(stderr, "keepsake inspect: one FILE only\n");
      return KS_EXIT_USAGE;
    } else {
      path = argv[i];
    }
  }
  if (!path) return inspect_usage(stderr), KS_EXIT_USAGE;
  if (ks_cli_is_dir(path)) return as_json ? ks_cli_inspect_dir_json(path) : ks_cli_inspect_dir(path);
  return inspect_file(path, as_json);
}

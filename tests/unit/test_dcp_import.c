/*
 * torch.distributed.checkpoint import (ks_torch_dcp_load, ks_dcp_import, and
 * `keepsake convert DIR OUT`) against the fixtures of tests/fixtures/dcp/, made
 * by torch 2.13's own dcp.save: every entry must equal, bit for bit, what
 * ks_torch_load reads from a torch.save of the same state dict; hostile
 * `.metadata` files (os.system / builtins.exec requests) are refused without
 * running anything; truncated or garbage `.metadata` and `.distcp` files, chunks
 * that do not tile their tensor and the SAFETENSORS format give clear errors;
 * every allocation failure gives KS_E_NOMEM and leaks nothing.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "keepsake/convert.h"
#include "keepsake/import.h"
#include "keepsake/layout.h"
#include "keepsake/torch.h"
#include "testutil.h"

#define FIX KS_FIXTURES_DIR "/dcp/"
#define MARKER "ks_dcp_pwned_marker"

/* ---- helpers ---- */

static void copy_file(const char *from, const char *to) {
  size_t n = 0;
  uint8_t *b = ks_test_read_file(from, &n);
  assert_non_null(b);
  assert_int_equal(ks_test_write_file(to, b, n), 0);
  free(b);
}

/* A fresh copy of a fixture directory (its .metadata and .distcp files) in a temp dir; returns the copy's path. */
static char *copy_fixture(const char *name, char **tmp) {
  static const char *const files[] = {".metadata", "__0_0.distcp", "__1_0.distcp"};
  *tmp = ks_test_tmpdir("dcp");
  char *dir = ks_test_path(*tmp, name);
  assert_int_equal(mkdir(dir, 0755), 0);
  for (size_t i = 0; i < 3; i++) {
    char src[4096];
    snprintf(src, sizeof src, FIX "%s/%s", name, files[i]);
    if (!ks_test_exists(src)) continue;
    char *dst = ks_test_path(dir, files[i]);
    copy_file(src, dst);
    free(dst);
  }
  return dir;
}

/* A table that serves one file name (any directory) from memory and the rest from the file system: the
   malformed-input loops below change a file thousands of times without writing it. */
typedef struct mem_file {
  ks_io io;
  const char *name;
  const uint8_t *bytes;
  size_t len;
} mem_file;

#define MEM_FD 1000000

static int mem_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  const mem_file *m = ctx;
  const char *slash = strrchr(path, '/');
  if (!strcmp(slash ? slash + 1 : path, m->name)) {
    *fd = MEM_FD;
    *size = m->len;
    return 0;
  }
  return ks_io_posix()->open_fn(ks_io_posix()->ctx, path, fd, size);
}

static int mem_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  const mem_file *m = ctx;
  if (fd != MEM_FD) return ks_io_posix()->read_fn(ks_io_posix()->ctx, fd, buf, n, off, got);
  size_t avail = off < m->len ? m->len - (size_t)off : 0;
  *got = n < avail ? n : avail;
  if (*got) memcpy(buf, m->bytes + off, *got);
  return 0;
}

static int mem_close(void *ctx, int fd) {
  (void)ctx;
  return fd == MEM_FD ? 0 : ks_io_posix()->close_fn(ks_io_posix()->ctx, fd);
}

static void mem_init(mem_file *m, const char *name) {
  memset(m, 0, sizeof *m);
  m->io = *ks_io_posix();
  m->io.ctx = m;
  m->io.open_fn = mem_open;
  m->io.read_fn = mem_read;
  m->io.close_fn = mem_close;
  m->io.map_fn = NULL;
  m->io.unmap_fn = NULL;
  m->name = name;
}

static void assert_same_entry(const ks_entry *a, const ks_entry *b) {
  assert_string_equal(a->name, b->name);
  assert_int_equal(a->kind, b->kind);
  switch (a->kind) {
    case KS_VAL_TENSOR:
      assert_int_equal(a->tensor.dtype, b->tensor.dtype);
      assert_int_equal(a->tensor.rank, b->tensor.rank);
      for (int d = 0; d < a->tensor.rank; d++) assert_int_equal(a->tensor.shape[d], b->tensor.shape[d]);
      assert_int_equal(a->tensor.nbytes, b->tensor.nbytes);
      if (a->tensor.nbytes) assert_memory_equal(a->tensor.data, b->tensor.data, a->tensor.nbytes);
      break;
    case KS_VAL_INT:
    case KS_VAL_BOOL: assert_int_equal(a->i, b->i); break;
    case KS_VAL_FLOAT: assert_memory_equal(&a->f, &b->f, sizeof a->f); break; /* bit for bit */
    case KS_VAL_STRING: assert_string_equal(a->s, b->s); break;
    case KS_VAL_NULL: break;
  }
}

/* Same names (any order), kinds and bytes. */
static void assert_same_dict(const ks_statedict *got, const ks_statedict *want) {
  assert_int_equal(ks_statedict_count(got), ks_statedict_count(want));
  ks_entry w, g;
  for (size_t i = 0; ks_statedict_at(want, i, &w) == KS_OK; i++) {
    if (ks_statedict_get(got, w.name, &g) != KS_OK) fail_msg("'%s' is missing", w.name);
    assert_same_entry(&g, &w);
  }
}

static json_t *parse(const char *text) {
  assert_non_null(text);
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  assert_non_null(j);
  return j;
}

/* The import of FIX/<name> equals ks_torch_load of FIX/<name>.pt, structure document included. */
static void check_against_pt(const char *name, const char *skipped_key, const char *skipped_why, size_t chunks) {
  char dir[512], pt[512];
  snprintf(dir, sizeof dir, FIX "%s", name);
  snprintf(pt, sizeof pt, FIX "%s.pt", name);
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  ks_import_opts io = {.read = &ro};
  ks_statedict *got = NULL, *want = NULL;
  ks_meta *meta = NULL;
  char *want_structure = NULL;
  ks_error err;
  ks_status st = ks_dcp_import(dir, &io, &got, &meta, &err);
  if (st) fail_msg("%s: %s", name, err.message);
  assert_int_equal(ks_torch_load(pt, NULL, &want, &want_structure, &err), KS_OK);
  assert_same_dict(got, want);
  json_t *a = parse(ks_meta_get(meta, KS_TORCH_STRUCTURE_META)), *b = parse(want_structure);
  assert_true(json_equal(a, b));
  json_t *info = parse(ks_meta_get(meta, KS_META_DCP_IMPORT));
  assert_string_equal(json_string_value(json_object_get(info, "format")), "torch.distributed.checkpoint");
  assert_string_equal(json_string_value(json_object_get(info, "version")), "1.0.0");
  assert_int_equal(json_integer_value(json_object_get(info, "chunks")), chunks);
  json_t *skipped = json_object_get(info, "skipped");
  assert_int_equal(json_object_size(skipped), skipped_key ? 1 : 0);
  if (skipped_key) assert_string_equal(json_string_value(json_object_get(skipped, skipped_key)), skipped_why);
  json_decref(info);
  json_decref(a);
  json_decref(b);
  ks_torch_free(NULL, want_structure);
  ks_meta_free(meta);
  ks_statedict_free(got);
  ks_statedict_free(want);
}

/* ---- values ---- */

static void test_basic_equals_torch_save(void **state) {
  (void)state;
  check_against_pt("basic", "when", "an object of class datetime.date", 16);
}

static void test_two_ranks_assembled(void **state) {
  (void)state;
  /* row: Shard(0), 5 rows over 2 ranks (3 + 2); col: Shard(1); bias: Replicate (saved once); rep: plain */
  check_against_pt("two_rank", NULL, NULL, 6);
}

static void test_convert_cli_and_library(void **state) {
  (void)state;
  char *tmp = ks_test_tmpdir("dcp-cli");
  char *out = ks_test_path(tmp, "two.keepsake"), *pt = ks_test_path(tmp, "two.pt");
  char cmd[2048], *text = NULL;
  snprintf(cmd, sizeof cmd, "'%s' convert '" FIX "two_rank' '%s'", KS_CLI_PATH, out);
  int rc = ks_test_run(cmd, &text);
  if (rc) fail_msg("%s", text ? text : "");
  assert_non_null(strstr(text, "7 entries"));
  free(text);
  ks_statedict *got = NULL, *want = NULL;
  ks_meta *meta = NULL;
  assert_int_equal(ks_load(out, NULL, &got, &meta, NULL), KS_OK);
  assert_int_equal(ks_torch_load(FIX "two_rank.pt", NULL, &want, NULL, NULL), KS_OK);
  assert_same_dict(got, want);
  assert_non_null(ks_meta_get(meta, KS_META_DCP_IMPORT));
  ks_meta_free(meta);
  ks_statedict_free(got);
  /* and back to a .pt through the library: the list "tags" is a list again */
  ks_convert_report *rep = NULL;
  assert_int_equal(ks_convert(FIX "two_rank", pt, NULL, &rep, NULL), KS_OK);
  assert_int_equal(ks_convert_report_written(rep), 7);
  ks_convert_report_free(rep);
  char *structure = NULL;
  assert_int_equal(ks_torch_load(pt, NULL, &got, &structure, NULL), KS_OK);
  assert_same_dict(got, want);
  assert_non_null(strstr(structure, "\"tags\":{\"kind\":\"list\",\"len\":2}"));
  ks_torch_free(NULL, structure);
  ks_statedict_free(got);
  ks_statedict_free(want);
  free(out);
  free(pt);
  ks_test_rmtree(tmp);
  free(tmp);
}

static void test_probe(void **state) {
  (void)state;
  assert_true((ks_torch_probe(FIX "basic", NULL) == KS_TORCH_DCP));
  assert_false((ks_torch_probe(FIX "basic.pt", NULL) == KS_TORCH_DCP));
  assert_false((ks_torch_probe(FIX "basic/.metadata", NULL) == KS_TORCH_DCP));
  assert_false((ks_torch_probe(KS_FIXTURES_DIR, NULL) == KS_TORCH_DCP)); /* a directory without .metadata */
  assert_false((ks_torch_probe(NULL, NULL) == KS_TORCH_DCP));
}

/* ---- hostile ---- */

/* Imports dir with the working directory in a scratch folder, where the payloads would create MARKER. */
static ks_status import_in_scratch(const char *dir, ks_statedict **sd, ks_meta **meta, ks_error *err,
                                   int *marker_made) {
  char *scratch = ks_test_tmpdir("dcp-scratch"), cwd[4096];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(scratch), 0);
  ks_status st = ks_dcp_import(dir, NULL, sd, meta, err);
  *marker_made = ks_test_exists(MARKER);
  assert_int_equal(chdir(cwd), 0);
  ks_test_rmtree(scratch);
  free(scratch);
  return st;
}

static void test_hostile_metadata_refused(void **state) {
  (void)state;
  char *tmp, *dir = copy_fixture("basic", &tmp), *md = ks_test_path(dir, ".metadata");
  ks_statedict *sd = NULL;
  ks_error err;
  int made = 0;
  /* Real Metadata carrying posix.system and builtins.exec requests (made by make_dcp.py). */
  copy_file(FIX "hostile.metadata", md);
  assert_int_equal(import_in_scratch(dir, &sd, NULL, &err, &made), KS_E_UNSAFE);
  assert_false(made);
  assert_null(sd);
  assert_non_null(strstr(err.message, "posix.system"));
  assert_non_null(strstr(err.file, ".metadata"));
  /* Bare payloads, protocol 0 and 4, and one inside a Metadata object. */
  static const char p0[] = "cposix\nsystem\n(X\x19\x00\x00\x00" "touch " MARKER "tR.";
  static const char p4[] = "\x80\x04\x8c\x08" "builtins" "\x8c\x04" "exec" "\x93"
                           "\x8c\x28" "open('" MARKER "', 'w').close()" "\x85R.";
  static const char p_inner[] = "\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}(X\x07\x00\x00\x00"
                                "version" "cos\nsystem\n(X\x19\x00\x00\x00" "touch " MARKER "tRub.";
  const struct {
    const char *bytes;
    size_t len;
    const char *name;
  } payloads[] = {{p0, sizeof p0 - 1, "posix.system"},
                  {p4, sizeof p4 - 1, "builtins.exec"},
                  {p_inner, sizeof p_inner - 1, "os.system"}};
  for (size_t i = 0; i < sizeof payloads / sizeof *payloads; i++) {
    assert_int_equal(ks_test_write_file(md, payloads[i].bytes, payloads[i].len), 0);
    assert_int_equal(import_in_scratch(dir, &sd, NULL, &err, &made), KS_E_UNSAFE);
    assert_false(made);
    assert_non_null(strstr(err.message, payloads[i].name));
  }
  /* An opcode the machine does not take (protocol 0 STRING) stops it before anything is described. */
  static const char p_str[] = "cposix\nsystem\n(S'touch " MARKER "'\ntR.";
  assert_int_equal(ks_test_write_file(md, p_str, sizeof p_str - 1), 0);
  assert_int_equal(import_in_scratch(dir, &sd, NULL, &err, &made), KS_E_UNSUPPORTED);
  assert_false(made);
  free(md);
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

static void test_hostile_object_skipped(void **state) {
  (void)state;
  ks_statedict *sd = NULL;
  ks_meta *meta = NULL;
  ks_error err;
  int made = 0;
  assert_int_equal(import_in_scratch(FIX "evil_object", &sd, &meta, &err, &made), KS_OK);
  assert_false(made);
  assert_int_equal(ks_statedict_count(sd), 1);
  const ks_tensor *w = ks_statedict_tensor(sd, "w");
  assert_non_null(w);
  const float want[3] = {0, 1, 2};
  assert_memory_equal(w->data, want, sizeof want);
  json_t *info = parse(ks_meta_get(meta, KS_META_DCP_IMPORT));
  assert_string_equal(json_string_value(json_object_get(json_object_get(info, "skipped"), "payload")),
                      "an object of class posix.system");
  json_decref(info);
  ks_meta_free(meta);
  ks_statedict_free(sd);
}

/* ---- malformed ---- */

static void test_truncated_and_garbage_metadata(void **state) {
  (void)state;
  size_t n = 0;
  uint8_t *orig = ks_test_read_file(FIX "basic/.metadata", &n);
  assert_non_null(orig);
  mem_file m;
  mem_init(&m, ".metadata");
  ks_torch_read_opts ro = {0};
  ro.io = &m.io;
  ks_error err;
  m.bytes = orig;
  for (m.len = 0; m.len < n; m.len++) { /* every prefix */
    ks_statedict *sd = NULL;
    ks_status st = ks_torch_dcp_load(FIX "basic", &ro, &sd, NULL, NULL, &err);
    if (st != KS_E_FORMAT) fail_msg("prefix of %zu bytes: %s (%s)", m.len, ks_status_name(st), err.message);
    assert_non_null(strstr(err.file, ".metadata"));
    assert_null(sd);
  }
  uint32_t x = 12345;
  uint8_t *junk = malloc(n);
  assert_non_null(junk);
  m.bytes = junk;
  m.len = n;
  for (int round = 0; round < 2000; round++) { /* random bytes, then the real file with bytes changed */
    memcpy(junk, orig, n);
    for (size_t i = 0; i < n; i++) {
      x = x * 1103515245u + 12345u;
      if (round < 50 || (x >> 16) % 997 == 0) junk[i] = (uint8_t)(x >> 24);
    }
    ks_statedict *sd = NULL;
    ks_status st = ks_torch_dcp_load(FIX "basic", &ro, &sd, NULL, NULL, &err);
    if (round < 50) assert_int_not_equal(st, KS_OK);
    if (st) assert_true(err.message[0]);
    ks_statedict_free(sd);
  }
  free(junk);
  free(orig);
}

static void test_truncated_and_garbage_distcp(void **state) {
  (void)state;
  size_t n = 0;
  uint8_t *orig = ks_test_read_file(FIX "two_rank/__1_0.distcp", &n), *bad = malloc(n);
  assert_non_null(orig);
  assert_non_null(bad);
  mem_file m;
  mem_init(&m, "__1_0.distcp");
  ks_torch_read_opts ro = {0};
  ro.io = &m.io;
  ks_statedict *sd = NULL;
  ks_error err;
  /* truncated: the items past the end are named */
  m.bytes = orig;
  m.len = n / 2;
  assert_int_equal(ks_torch_dcp_load(FIX "two_rank", &ro, &sd, NULL, NULL, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.file, "__1_0.distcp"));
  assert_non_null(strstr(err.message, "passes the end of the file"));
  /* the first item is not a zip */
  memcpy(bad, orig, n);
  memcpy(bad, "JUNK", 4);
  m.bytes = bad;
  m.len = n;
  assert_int_equal(ks_torch_dcp_load(FIX "two_rank", &ro, &sd, NULL, NULL, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "not a torch.save archive"));
  /* every byte changed in turn: an error, or (zip padding, entries never read) exactly the original values,
     since with CRCs checked no changed tensor or pickle byte gets through */
  ro.verify_crc = 1;
  ks_statedict *ref = NULL;
  assert_int_equal(ks_torch_load(FIX "two_rank.pt", NULL, &ref, NULL, NULL), KS_OK);
  size_t checksum = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(bad, orig, n);
    bad[i] ^= 0x5a;
    ks_status st = ks_torch_dcp_load(FIX "two_rank", &ro, &sd, NULL, NULL, &err);
    if (st == KS_OK) assert_same_dict(sd, ref);
    else assert_true(err.message[0] && strstr(err.file, "__1_0.distcp"));
    checksum += st == KS_E_CHECKSUM;
    ks_statedict_free(sd);
    sd = NULL;
  }
  assert_true(checksum > 100);
  ks_statedict_free(ref);
  /* a missing rank file */
  char *tmp, *dir = copy_fixture("two_rank", &tmp), *f = ks_test_path(dir, "__1_0.distcp");
  assert_int_equal(unlink(f), 0);
  assert_int_equal(ks_torch_dcp_load(dir, NULL, &sd, NULL, NULL, &err), KS_E_IO);
  assert_non_null(strstr(err.file, "__1_0.distcp"));
  free(bad);
  free(orig);
  free(f);
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

static void test_chunks_must_tile(void **state) {
  (void)state;
  static const char *const bad[] = {"two_rank_overlap.metadata", "two_rank_gap.metadata"};
  static const char *const why[] = {"overlaps another chunk", "do not cover it exactly once"};
  char *tmp, *dir = copy_fixture("two_rank", &tmp), *md = ks_test_path(dir, ".metadata");
  for (size_t i = 0; i < 2; i++) {
    char src[512];
    snprintf(src, sizeof src, FIX "%s", bad[i]);
    copy_file(src, md);
    ks_statedict *sd = NULL;
    ks_error err;
    assert_int_equal(ks_torch_dcp_load(dir, NULL, &sd, NULL, NULL, &err), KS_E_FORMAT);
    assert_string_equal(err.key, "model.row");
    assert_non_null(strstr(err.message, why[i]));
  }
  free(md);
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

/* Shared references cannot multiply the work: a chunk list shared by every entry, an object with many attributes. */
static void test_shared_references_bounded(void **state) {
  (void)state;
  char *tmp, *dir = copy_fixture("basic", &tmp), *md = ks_test_path(dir, ".metadata");
  ks_statedict *sd = NULL;
  ks_error err;
  copy_file(FIX "shared_chunks.metadata", md);
  assert_int_equal(ks_torch_dcp_load(dir, NULL, &sd, NULL, NULL, &err), KS_E_LIMIT);
  assert_non_null(strstr(err.message, "more chunks than bytes"));
  /* Metadata whose state_dict_metadata entry is a BytesStorageMetadata with 40 attributes */
  char p[4096];
  size_t n = 0;
  n += (size_t)snprintf(p + n, sizeof p - n, "\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}(U\x13"
                                              "state_dict_metadata}(U\x01xctorch.distributed.checkpoint.metadata\n"
                                              "TensorStorageMetadata\n)\x81}(");
  for (int i = 0; i < 40; i++) n += (size_t)snprintf(p + n, sizeof p - n, "U\x03" "a%02dK\x01", i);
  n += (size_t)snprintf(p + n, sizeof p - n, "ubuub.");
  assert_int_equal(ks_test_write_file(md, p, n), 0);
  assert_int_equal(ks_torch_dcp_load(dir, NULL, &sd, NULL, NULL, &err), KS_E_FORMAT);
  assert_string_equal(err.key, "x");
  assert_null(sd);
  free(md);
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

static void test_safetensors_format_refused(void **state) {
  (void)state;
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(ks_torch_dcp_load(FIX "safetensors", NULL, &sd, NULL, NULL, &err), KS_E_UNSUPPORTED);
  assert_non_null(strstr(err.message, "SAFETENSORS"));
  assert_null(sd);
}

static void test_output_budget(void **state) {
  (void)state;
  ks_torch_read_opts ro = {0};
  ro.max_output_bytes = 100; /* two_rank's tensors take 152 bytes */
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(ks_torch_dcp_load(FIX "two_rank", &ro, &sd, NULL, NULL, &err), KS_E_LIMIT);
  assert_null(sd);
}


/* ---- directories keepsake's DCP writer wrote: the same state, named alike ---- */

static void import_dir(const char *dir, ks_statedict **sd, ks_meta **meta) {
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  ks_import_opts io = {.read = &ro};
  ks_error err;
  ks_status st = ks_dcp_import(dir, &io, sd, meta, &err);
  if (st) fail_msg("%s: %s (%s)", dir, err.message, ks_status_name(st));
}

/* Fixtures keepsake 0.1.0's KeepsakeWriter wrote (DCP keys `model.linear.weight`, values as typed JSON) import as
   their torch twins do: the same names (planner_data's paths), values and structure document. */
static void check_twins(const char *keepsake_dir, const char *torch_dir, size_t chunks) {
  ks_statedict *a = NULL, *b = NULL;
  ks_meta *ma = NULL, *mb = NULL;
  import_dir(keepsake_dir, &a, &ma);
  import_dir(torch_dir, &b, &mb);
  assert_same_dict(a, b);
  json_t *x = parse(ks_meta_get(ma, KS_TORCH_STRUCTURE_META)), *y = parse(ks_meta_get(mb, KS_TORCH_STRUCTURE_META));
  assert_true(json_equal(x, y));
  json_t *info = parse(ks_meta_get(ma, KS_META_DCP_IMPORT));
  assert_string_equal(json_string_value(json_object_get(info, "format")), "keepsake.distributed");
  assert_int_equal(json_integer_value(json_object_get(info, "chunks")), chunks);
  assert_int_equal(json_object_size(json_object_get(info, "skipped")), 0);
  assert_int_equal(json_integer_value(json_object_get(info, "checksummed")),
                   json_integer_value(json_object_get(info, "files")));
  assert_null(ks_meta_get(ma, "keepsake.dcp")); /* the stored layout's record is not state */
  json_decref(info);
  json_decref(x);
  json_decref(y);
  ks_meta_free(ma);
  ks_meta_free(mb);
  ks_statedict_free(a);
  ks_statedict_free(b);
}

static void test_keepsake_writer_names_as_torch(void **state) {
  (void)state;
  /* basic's datetime.date is left out by the import; KeepsakeWriter could not store it at all */
  check_twins(FIX "keepsake_writer", FIX "basic", 16);
  /* two ranks: DTensors by rows and by columns, and values DCP gave to rank 1 */
  check_twins(FIX "keepsake_writer_two_rank", FIX "two_rank", 6);
}

static void test_keepsake_writer_damage_refused(void **state) {
  (void)state;
  char *tmp = ks_test_tmpdir("dcp-ks");
  char *dir = ks_test_path(tmp, "ks");
  assert_int_equal(mkdir(dir, 0755), 0);
  static const char *const files[] = {"model.safetensors.index.json", "rank-00000-of-00002.keepsake",
                                      "rank-00001-of-00002.keepsake"};
  char src[512], *dst[3];
  for (int i = 0; i < 3; i++) {
    snprintf(src, sizeof src, FIX "keepsake_writer_two_rank/%s", files[i]);
    dst[i] = ks_test_path(dir, files[i]);
    copy_file(src, dst[i]);
  }
  size_t n = 0;
  uint8_t *b = ks_test_read_file(dst[2], &n);
  b[n - 1] ^= 1; /* the last byte of a tensor of rank 1's file */
  assert_int_equal(ks_test_write_file(dst[2], b, n), 0);
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  ks_import_opts io = {.read = &ro};
  ks_statedict *sd = NULL;
  ks_error err;
  assert_int_equal(ks_dcp_import(dir, &io, &sd, NULL, &err), KS_E_CHECKSUM);
  assert_null(sd);
  free(b);
  for (int i = 0; i < 3; i++) free(dst[i]);
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

/* ---- Hugging Face layouts ---- */

/* dir/name: a safetensors file (written by ks_save) of the tensors `names` (rows x 3 F32 each, values from
   `first`), recording the given DCP_SHARDING_INFO (NULL: none). */
static void write_st(const char *dir, const char *name, const char *const *names, const int64_t *rows,
                     const float *first, size_t n, const char *sharding) {
  ks_statedict *sd = NULL;
  ks_meta *m = NULL;
  assert_int_equal(ks_statedict_create(NULL, &sd, NULL), KS_OK);
  assert_int_equal(ks_meta_create(NULL, &m, NULL), KS_OK);
  for (size_t i = 0; i < n; i++) {
    int64_t shape[2] = {rows[i], 3};
    void *data = NULL;
    assert_int_equal(ks_statedict_new_tensor(sd, names[i], KS_F32, 2, shape, &data, NULL), KS_OK);
    for (int64_t k = 0; k < rows[i] * 3; k++) ((float *)data)[k] = first[i] + (float)k;
  }
  if (sharding) assert_int_equal(ks_meta_set(m, "DCP_SHARDING_INFO", sharding, NULL), KS_OK);
  char *path = ks_test_path(dir, name);
  assert_int_equal(ks_save(path, sd, m, NULL, NULL), KS_OK);
  free(path);
  ks_meta_free(m);
  ks_statedict_free(sd);
}

static char *fresh_dir(const char *tmp, const char *name) {
  char *dir = ks_test_path(tmp, name);
  ks_test_rmtree(dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  return dir;
}

static ks_status import_status(const char *dir, ks_statedict **sd, ks_error *err) {
  ks_torch_read_opts ro = {0};
  ro.verify_crc = 1;
  ks_import_opts io = {.read = &ro};
  return ks_dcp_import(dir, &io, sd, NULL, err);
}

/* HuggingFaceStorageWriter with save_distributed: one file per rank, each holding a chunk of `w` (rows 0-2 and 3-4)
   placed by DCP_SHARDING_INFO, no index. */
static void write_chunked(const char *dir, const char *second_offsets, int64_t second_rows) {
  const char *w[] = {"model.w", "model.b"};
  int64_t r1[] = {3, 1}, r2[] = {second_rows};
  float f1[] = {0, 100}, f2[] = {9};
  write_st(dir, "shard-00001-model-00001-of-00001.safetensors", w, r1, f1, 2,
           "{\"model.w\":{\"saved_offsets\":[0,0]},\"model.b\":{\"saved_offsets\":[0,0]}}");
  char info[256];
  snprintf(info, sizeof info, "{\"model.w\":{\"saved_offsets\":%s}}", second_offsets);
  write_st(dir, "shard-00002-model-00001-of-00001.safetensors", w, r2, f2, 1, info);
}

static void test_hf_layouts(void **state) {
  (void)state;
  char *tmp = ks_test_tmpdir("dcp-hf"), *dir;
  ks_statedict *sd = NULL;
  ks_error err;
  /* chunks put together: rows 0-2 from the first file, 3-4 from the second */
  dir = fresh_dir(tmp, "chunks");
  write_chunked(dir, "[3,0]", 2);
  assert_int_equal(import_status(dir, &sd, &err), KS_OK);
  const ks_tensor *t = ks_statedict_tensor(sd, "model.w");
  assert_non_null(t);
  assert_int_equal(t->shape[0], 5);
  for (int k = 0; k < 15; k++) assert_true(((const float *)t->data)[k] == (float)(k < 9 ? k : k - 9 + 9));
  assert_non_null(ks_statedict_tensor(sd, "model.b"));
  ks_statedict_free(sd);
  sd = NULL;
  free(dir);
  /* overlapping chunks (rows 2-3 twice), and a gap the extents leave (rows 3-4 missing a row) */
  static const struct {
    const char *offsets;
    int64_t rows;
    ks_status want;
    const char *says;
  } bad[] = {{"[2,0]", 2, KS_E_FORMAT, "cover it exactly once"},
             {"[4,0]", 2, KS_E_FORMAT, "cover it exactly once"},
             {"[0]", 2, KS_E_FORMAT, "saved_offsets"},
             {"[-1,0]", 2, KS_E_FORMAT, "saved_offsets"},
             {"[9223372036854775807,0]", 2, KS_E_FORMAT, "saved_offsets"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    dir = fresh_dir(tmp, "bad");
    write_chunked(dir, bad[i].offsets, bad[i].rows);
    ks_status st = import_status(dir, &sd, &err);
    if (st != bad[i].want || !strstr(err.message, bad[i].says))
      fail_msg("%s: %s: %s", bad[i].offsets, ks_status_name(st), err.message);
    assert_null(sd);
    free(dir);
  }
  /* volumes that add up, but rows 1 twice and row 2 never: rows 0-1, row 1, row 3 of 4 */
  dir = fresh_dir(tmp, "overlap");
  const char *wn[] = {"w"};
  int64_t two[] = {2}, one[] = {1};
  float f0[] = {0};
  write_st(dir, "a.safetensors", wn, two, f0, 1, "{\"w\":{\"saved_offsets\":[0,0]}}");
  write_st(dir, "b.safetensors", wn, one, f0, 1, "{\"w\":{\"saved_offsets\":[1,0]}}");
  write_st(dir, "c.safetensors", wn, one, f0, 1, "{\"w\":{\"saved_offsets\":[3,0]}}");
  assert_int_equal(import_status(dir, &sd, &err), KS_E_FORMAT);
  assert_non_null(strstr(err.message, "overlaps"));
  assert_null(sd);
  free(dir);
  /* an index: the files its weight_map names; a name it places in a file that lacks it; a path outside */
  dir = fresh_dir(tmp, "index");
  const char *names[] = {"a.w", "a.b"};
  int64_t rows[] = {2, 1};
  float first[] = {1, 2};
  write_st(dir, "model-00001-of-00001.safetensors", names, rows, first, 2, NULL);
  char *index = ks_test_path(dir, "model.safetensors.index.json");
  static const struct {
    const char *text;
    ks_status want;
  } idx[] = {
      {"{\"metadata\":{},\"weight_map\":{\"a.w\":\"model-00001-of-00001.safetensors\"}}", KS_OK},
      {"{\"weight_map\":{\"a.x\":\"model-00001-of-00001.safetensors\"}}", KS_E_FORMAT},
      {"{\"weight_map\":{\"a.w\":\"../model-00001-of-00001.safetensors\"}}", KS_E_FORMAT},
      {"{\"weight_map\":{\"a.w\":\"missing.safetensors\"}}", KS_E_IO},
      {"{\"weight_map\":{\"a.w\":7}}", KS_E_FORMAT},
      {"{\"metadata\":{}}", KS_E_FORMAT},
      {"[1]", KS_E_FORMAT},
  };
  for (size_t i = 0; i < sizeof idx / sizeof *idx; i++) {
    assert_int_equal(ks_test_write_file(index, idx[i].text, strlen(idx[i].text)), 0);
    ks_status st = import_status(dir, &sd, &err);
    if (st != idx[i].want) fail_msg("%s: %s: %s", idx[i].text, ks_status_name(st), err.message);
    if (!st) assert_int_equal(ks_statedict_count(sd), 2); /* every tensor of the files it names */
    ks_statedict_free(sd);
    sd = NULL;
  }
  free(index);
  free(dir);
  /* no checkpoint at all: refused as such, not as an I/O error */
  dir = fresh_dir(tmp, "empty");
  assert_int_equal(import_status(dir, &sd, &err), KS_E_UNSUPPORTED);
  assert_non_null(strstr(err.message, "not a checkpoint directory"));
  free(dir);
  ks_test_rmtree(tmp);
  free(tmp);
}

/* The Hugging Face layout ks_convert writes reads back as the state it came from; its index names every tensor by
   the name DCP gives it. */
static void test_hf_export_round_trip(void **state) {
  (void)state;
  char *tmp = ks_test_tmpdir("dcp-hfx");
  char *out = ks_test_path(tmp, "hf");
  ks_convert_opts o = {0};
  o.size = sizeof o;
  o.hf = 1;
  o.hf_shard_bytes = 64; /* a file per tensor or two */
  ks_error err;
  ks_status st = ks_convert(FIX "keepsake_writer", out, &o, NULL, &err);
  if (st) fail_msg("%s", err.message);
  char *index = ks_test_path(out, "model.safetensors.index.json");
  size_t n = 0;
  char *text = (char *)ks_test_read_file(index, &n);
  assert_non_null(text);
  json_t *j = json_loadb(text, n, 0, NULL), *wm = json_object_get(j, "weight_map");
  assert_non_null(wm);
  assert_int_equal(json_object_size(wm), 16);
  const char *first = json_string_value(json_object_get(wm, "model.linear.weight"));
  assert_non_null(first);
  assert_true(!strncmp(first, "model-0000", 10));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "metadata"), "total_size")) > 0, 1);
  ks_statedict *a = NULL, *b = NULL;
  ks_meta *ma = NULL, *mb = NULL;
  import_dir(out, &a, &ma);
  import_dir(FIX "keepsake_writer", &b, &mb);
  assert_same_dict(a, b);
  json_t *x = parse(ks_meta_get(ma, KS_TORCH_STRUCTURE_META)), *y = parse(ks_meta_get(mb, KS_TORCH_STRUCTURE_META));
  assert_true(json_equal(x, y));
  /* into a directory that is not empty: refused, nothing written */
  o.hf_shard_bytes = 0;
  assert_int_equal(ks_convert(FIX "keepsake_writer", out, &o, NULL, &err), KS_E_EXISTS);
  json_decref(x);
  json_decref(y);
  json_decref(j);
  free(text);
  free(index);
  ks_meta_free(ma);
  ks_meta_free(mb);
  ks_statedict_free(a);
  ks_statedict_free(b);
  free(out);
  ks_test_rmtree(tmp);
  free(tmp);
}

static void test_every_allocation_failure(void **state) {
  (void)state;
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_torch_read_opts ro = {0};
    ro.alloc = &ta.a;
    ks_import_opts io = {.read = &ro};
    ks_statedict *sd = NULL;
    ks_meta *meta = NULL;
    ks_status st = ks_dcp_import(FIX "basic", &io, &sd, &meta, NULL);
    if (st == KS_OK) {
      assert_true(n > 100);
      assert_non_null(ks_statedict_tensor(sd, "model/linear.weight"));
      ks_meta_free(meta);
      ks_statedict_free(sd);
      assert_int_equal(ta.live, 0);
      break;
    }
    if (st != KS_E_NOMEM) fail_msg("allocation %ld failing gave %s", n, ks_status_name(st));
    assert_null(sd);
    assert_int_equal(ta.live, 0);
  }
}

/* The same for a directory KeepsakeWriter wrote, a Hugging Face layout, and the export to one. */
static void every_allocation_failure_of(const char *dir, const char *hf_out) {
  for (long n = 1;; n++) {
    ks_test_alloc ta;
    ks_test_alloc_init(&ta, n);
    ks_status st;
    ks_statedict *sd = NULL;
    ks_meta *meta = NULL;
    if (hf_out) {
      ks_test_rmtree(hf_out);
      ks_convert_opts o = {0};
      o.size = sizeof o;
      o.alloc = &ta.a;
      o.hf = 1;
      o.hf_shard_bytes = 64;
      st = ks_convert(dir, hf_out, &o, NULL, NULL);
    } else {
      ks_torch_read_opts ro = {0};
      ro.alloc = &ta.a;
      ro.verify_crc = 1;
      ks_import_opts io = {.read = &ro};
      st = ks_dcp_import(dir, &io, &sd, &meta, NULL);
    }
    ks_meta_free(meta);
    ks_statedict_free(sd);
    if (ta.live) fail_msg("%s%s: allocation %ld failing (%s) leaves %ld allocations", dir, hf_out ? " (export)" : "",
                          n, ks_status_name(st), (long)ta.live);
    if (st == KS_OK) {
      assert_true(n > 20);
      break;
    }
    if (st != KS_E_NOMEM) fail_msg("%s: allocation %ld failing gave %s", dir, n, ks_status_name(st));
  }
}

static void test_every_allocation_failure_of_other_layouts(void **state) {
  (void)state;
  char *tmp = ks_test_tmpdir("dcp-alloc");
  char *hf = ks_test_path(tmp, "hf");
  every_allocation_failure_of(FIX "keepsake_writer_two_rank", NULL);
  every_allocation_failure_of(FIX "keepsake_writer", hf); /* writes the layout, then reads it */
  every_allocation_failure_of(hf, NULL);
  char *chunks = fresh_dir(tmp, "chunks");
  write_chunked(chunks, "[3,0]", 2);
  every_allocation_failure_of(chunks, NULL);
  free(chunks);
  free(hf);
  ks_test_rmtree(tmp);
  free(tmp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basic_equals_torch_save),
      cmocka_unit_test(test_two_ranks_assembled),
      cmocka_unit_test(test_convert_cli_and_library),
      cmocka_unit_test(test_probe),
      cmocka_unit_test(test_hostile_metadata_refused),
      cmocka_unit_test(test_hostile_object_skipped),
      cmocka_unit_test(test_truncated_and_garbage_metadata),
      cmocka_unit_test(test_truncated_and_garbage_distcp),
      cmocka_unit_test(test_chunks_must_tile),
      cmocka_unit_test(test_shared_references_bounded),
      cmocka_unit_test(test_safetensors_format_refused),
      cmocka_unit_test(test_output_budget),
      cmocka_unit_test(test_keepsake_writer_names_as_torch),
      cmocka_unit_test(test_keepsake_writer_damage_refused),
      cmocka_unit_test(test_hf_layouts),
      cmocka_unit_test(test_hf_export_round_trip),
      cmocka_unit_test(test_every_allocation_failure),
      cmocka_unit_test(test_every_allocation_failure_of_other_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

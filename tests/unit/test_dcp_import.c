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
      cmocka_unit_test(test_every_allocation_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

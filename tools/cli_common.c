/* Helpers shared by the keepsake subcommands (see cli_common.h). */
#include "cli_common.h"
#include "keepsake/layout.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ks_cli_print_error(FILE *out, const char *cmd, const ks_error *err) {
  char line[KS_ERROR_MSG_MAX + 3 * KS_ERROR_WHERE_MAX];
  fprintf(out, "keepsake %s: %s\n", cmd, ks_cli_esc(ks_error_format(err, line, sizeof line)));
}

/* ---- escaping for the terminal ---- */

/* Length of the UTF-8 sequence at s (1..4), 0 when it is not valid UTF-8; *cp gets the code point. */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp) {
  size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (!n) return 0;
  uint32_t c = n == 1 ? s[0] : n == 2 ? s[0] & 0x1Fu : n == 3 ? s[0] & 0x0Fu : s[0] & 0x07u;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    c = c << 6 | (s[i] & 0x3Fu);
  }
  static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < min[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return n;
}

/* Code points a terminal acts on: C0, DEL, C1, and the bidirectional embeddings/overrides/isolates. */
static int is_control(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

int ks_cli_needs_esc(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    uint32_t c = 0;
    size_t n = utf8_seq(p, &c);
    if (!n || is_control(c)) return 1;
    p += n;
  }
  return 0;
}

/* Writes the escaped form of s into out (at least 6 * strlen(s) + 1 bytes). */
static void escape_into(const char *s, char *out) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    uint32_t c = 0;
    size_t n = utf8_seq(p, &c);
    if (!n) {
      out += sprintf(out, "\\x%02X", *p++);
    } else if (is_control(c)) {
      out += c < 0x80 ? sprintf(out, "\\x%02X", (unsigned)c) : sprintf(out, "\\u%04X", (unsigned)c);
      p += n;
    } else {
      memcpy(out, p, n);
      out += n, p += n;
    }
  }
  *out = 0;
}

const char *ks_cli_esc(const char *s) {
  static char *ring[8];
  static size_t caps[8];
  static unsigned next;
  if (!s) return "(null)";
  if (!ks_cli_needs_esc(s)) return s;
  unsigned i = next++ % 8;
  size_t need = strlen(s) * 6 + 1;
  if (caps[i] < need) {
    char *b = realloc(ring[i], need);
    if (!b) return "<unprintable: out of memory>";
    ring[i] = b, caps[i] = need;
  }
  escape_into(s, ring[i]);
  return ring[i];
}

/* ---- output, input and destination checks ---- */

int ks_cli_finish_output(const char *cmd, int rc) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  fprintf(stderr, "keepsake %s: cannot write output: %s\n", cmd, errno ? strerror(errno) : "write error");
  return KS_EXIT_USAGE;
}

ks_read_opts ks_cli_read_opts(void) {
  ks_read_opts o = {0};
  o.mode = KS_READ_COPY;
  return o;
}

static int io_error(ks_error *err, const char *path, const char *what, int e) {
  ks_error_clear(err);
  err->code = KS_E_IO;
  snprintf(err->file, sizeof err->file, "%s", path);
  err->offset = -1;
  snprintf(err->message, sizeof err->message, "%s%s%s", what, e ? ": " : "", e ? strerror(e) : "");
  return -1;
}

int ks_cli_read_file(const char *path, void **buf, size_t *len, ks_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused below, not waited on */
  if (fd < 0) return io_error(err, path, "cannot open", errno);
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    close(fd);
    return io_error(err, path, "not a regular file", 0);
  }
  size_t cap = (size_t)sb.st_size, n = 0;
  uint8_t *p = malloc(cap ? cap : 1);
  if (!p) {
    close(fd);
    return io_error(err, path, "out of memory", ENOMEM);
  }
  while (n < cap) {
    ssize_t r = read(fd, p + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      free(p), close(fd);
      return io_error(err, path, e ? "cannot read" : "file shrank while it was read", e);
    }
    n += (size_t)r;
  }
  close(fd);
  *buf = p, *len = n;
  return 0;
}

/* ---- string -> index map ---- */

struct ks_cli_index {
  ks_statedict *sd;
};

ks_cli_index *ks_cli_index_new(void) {
  ks_cli_index *x = calloc(1, sizeof *x);
  if (x && ks_statedict_create(NULL, &x->sd, NULL)) {
    free(x);
    return NULL;
  }
  return x;
}

size_t ks_cli_index_get_or_add(ks_cli_index *x, const char *key, size_t next) {
  ks_entry e;
  if (ks_statedict_get(x->sd, key, &e) == KS_OK && e.kind == KS_VAL_INT) return (size_t)e.i;
  return ks_statedict_set_int(x->sd, key, (int64_t)next, NULL) == KS_OK ? next : SIZE_MAX;
}

void ks_cli_index_free(ks_cli_index *x) {
  if (!x) return;
  ks_statedict_free(x->sd);
  free(x);
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
  for (size_t j = 0; j < t->ncols; j++) ok &= (line[j] = strdup(cells[j] ? ks_cli_esc(cells[j]) : "")) != NULL;
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

const ks_io *ks_cli_read_io(ks_io *io) {
  *io = *ks_io_posix();
  io->map_fn = NULL; /* the library then reads (map and unmap go together) */
  io->unmap_fn = NULL;
  io->caps &= ~KS_IO_CAP_MAP;
  return io;
}

int ks_cli_input_open(const char *cmd, const char *arg, ks_cli_input *in) {
  ks_error err;
  *in = (ks_cli_input){.arg = arg, .path = arg, .ro = ks_cli_read_opts()};
  in->read_io = ks_cli_read_io(&in->local);
  if (ks_storage_open(arg, NULL, &in->st, &err)) {
    ks_cli_print_error(stderr, cmd, &err);
    return -1;
  }
  in->path = ks_storage_path(in->st);
  if (ks_storage_is_remote(in->st)) in->io = in->ro.io = in->read_io = ks_storage_io(in->st);
  return 0;
}

void ks_cli_input_error(const ks_cli_input *in, ks_error *err) {
  if (!in->io || !err) return;
  if (!err->file[0] || !strcmp(err->file, in->path)) snprintf(err->file, sizeof err->file, "%s", in->arg);
  char detail[512];
  if (!ks_storage_last_error(in->st, detail, sizeof detail)) return;
  size_t n = strlen(err->message);
  snprintf(err->message + n, sizeof err->message - n, " [%s]", detail);
  /* the library reports a table's failure as KS_E_IO; the store knows a deadline or a budget from it */
  ks_error last;
  ks_status cls = ks_storage_last_status(in->st, &last);
  if (err->code == KS_E_IO && (cls == KS_E_NET || cls == KS_E_LIMIT)) err->code = cls;
}

int ks_cli_input_read(const ks_cli_input *in, void **buf, size_t *len, ks_error *err) {
  if (!in->io) return ks_cli_read_file(in->path, buf, len, err);
  int fd, e;
  uint64_t size;
  if ((e = in->io->open_fn(in->io->ctx, in->path, &fd, &size)) != 0) return io_error(err, in->arg, "cannot open", e);
  uint8_t *p = size < SIZE_MAX ? malloc(size ? (size_t)size : 1) : NULL;
  size_t got = 0;
  e = p ? in->io->read_fn(in->io->ctx, fd, p, (size_t)size, 0, &got) : ENOMEM;
  in->io->close_fn(in->io->ctx, fd);
  if (!e && got != size) e = EIO;
  if (e) {
    free(p);
    return io_error(err, in->arg, "cannot read", e);
  }
  *buf = p, *len = got;
  return 0;
}

void ks_cli_input_close(ks_cli_input *in) {
  ks_storage_free(in->st);
  in->st = NULL;
}

size_t ks_cli_input_head(const ks_cli_input *in, void *buf, size_t n) {
  const ks_io *io = in->io ? in->io : ks_io_posix(); /* open_fn refuses FIFOs without waiting on them */
  int fd;
  uint64_t size;
  size_t got = 0;
  if (io->open_fn(io->ctx, in->path, &fd, &size)) return 0;
  if (io->read_fn(io->ctx, fd, buf, n, 0, &got)) got = 0;
  io->close_fn(io->ctx, fd);
  return got;
}

#include "crashio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ENTRIES 128

typedef struct ent {
  char name[128];
  size_t node;
} ent;

typedef enum { N_FILE, N_DIR, N_LINK } node_kind;

/* A change to a directory's entries not yet made durable, in order. */
typedef struct pending {
  int drop; /* 1: remove name; 0: name -> node */
  char name[128];
  size_t node;
} pending;

struct ks_crash_node {
  node_kind kind;
  pending *pend;      /* directory: changes since its last fsync */
  size_t npend;
  uint8_t *vol, *dur; /* file data: what the process sees, what fsync made durable */
  size_t vol_len, dur_len;
  char target[256];   /* link content (written with the link's inode) */
  ent *ve, *de;       /* directory entries: volatile and durable */
  size_t nve, nde;
};

#define BASE ks_io_posix()

/* ---- the model ---- */

static size_t new_node(ks_crash_io *c, node_kind kind) {
  if (c->n_nodes == c->cap_nodes) {
    size_t cap = c->cap_nodes ? c->cap_nodes * 2 : 64;
    ks_crash_node *v = realloc(c->nodes, cap * sizeof *v);
    if (!v) abort();
    c->nodes = v;
    c->cap_nodes = cap;
  }
  ks_crash_node *n = &c->nodes[c->n_nodes];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  if (kind == N_DIR) {
    n->ve = calloc(MAX_ENTRIES, sizeof(ent));
    n->de = calloc(MAX_ENTRIES, sizeof(ent));
    if (!n->ve || !n->de) abort();
  }
  return c->n_nodes++;
}

/* The part of path under root ("" for root itself), or NULL when path is outside the model. */
static const char *rel_of(const ks_crash_io *c, const char *path) {
  size_t n = strlen(c->root);
  if (strncmp(path, c->root, n)) return NULL;
  if (path[n] == '\0') return "";
  return path[n] == '/' ? path + n + 1 : NULL;
}

static ent *find(ks_crash_node *dir, const char *name, size_t len) {
  for (size_t i = 0; i < dir->nve; i++)
    if (strlen(dir->ve[i].name) == len && !strncmp(dir->ve[i].name, name, len)) return &dir->ve[i];
  return NULL;
}

/* The directory node holding rel's last component, and that component; 0 when not modelled. */
static int parent_of(ks_crash_io *c, const char *rel, size_t *dir, const char **leaf) {
  size_t cur = 0;
  const char *p = rel;
  for (const char *slash; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
    ent *e = find(&c->nodes[cur], p, (size_t)(slash - p));
    if (!e || c->nodes[e->node].kind != N_DIR) return 0;
    cur = e->node;
  }
  if (!*p || strlen(p) >= sizeof(((ent *)0)->name)) return 0;
  *dir = cur;
  *leaf = p;
  return 1;
}

static int node_of(ks_crash_io *c, const char *rel, size_t *node) {
  size_t dir;
  const char *leaf;
  if (!*rel) {
    *node = 0;
    return 1;
  }
  if (!parent_of(c, rel, &dir, &leaf)) return 0;
  ent *e = find(&c->nodes[dir], leaf, strlen(leaf));
  if (e) *node = e->node;
  return e != NULL;
}

static void add_pending(ks_crash_io *c, ks_crash_node *d, int drop, const char *leaf, size_t node) {
  pending *v = realloc(d->pend, (d->npend + 1) * sizeof *v);
  if (!v) abort();
  d->pend = v;
  v[d->npend] = (pending){.drop = drop, .node = node};
  snprintf(v[d->npend].name, sizeof v[0].name, "%s", leaf);
  d->npend++;
  (void)c;
}

static void set_entry(ks_crash_io *c, size_t dir, const char *leaf, size_t node) {
  ks_crash_node *d = &c->nodes[dir];
  add_pending(c, d, 0, leaf, node);
  ent *e = find(d, leaf, strlen(leaf));
  if (!e) {
    if (d->nve == MAX_ENTRIES) {
      c->model_error = 1;
      return;
    }
    e = &d->ve[d->nve++];
    snprintf(e->name, sizeof e->name, "%s", leaf);
  }
  e->node = node;
}

static void drop_entry(ks_crash_io *c, ks_crash_node *d, const char *leaf) {
  add_pending(c, d, 1, leaf, 0);
  ent *e = find(d, leaf, strlen(leaf));
  if (e) *e = d->ve[--d->nve];
}

/* Adds a new node under abs path (already created on disk). */
static size_t model_add(ks_crash_io *c, const char *path, node_kind kind) {
  const char *rel = rel_of(c, path), *leaf;
  size_t dir;
  if (!rel) return (size_t)-1;
  if (!parent_of(c, rel, &dir, &leaf)) {
    c->model_error = 1;
    return (size_t)-1;
  }
  size_t n = new_node(c, kind);
  set_entry(c, dir, leaf, n);
  return n;
}

/* ---- steps ---- */

static void log_step(ks_crash_io *c, ks_crash_op op, const char *a, const char *b) {
  if (!c->record) return;
  if (c->n_log == c->cap_log) {
    size_t cap = c->cap_log ? c->cap_log * 2 : 256;
    ks_crash_step *v = realloc(c->log, cap * sizeof *v);
    if (!v) abort();
    c->log = v;
    c->cap_log = cap;
  }
  ks_crash_step *s = &c->log[c->n_log++];
  const char *ra = a ? rel_of(c, a) : NULL, *rb = b ? rel_of(c, b) : NULL;
  s->op = op;
  snprintf(s->path, sizeof s->path, "%s", ra ? ra : (a ? a : ""));
  snprintf(s->path2, sizeof s->path2, "%s", rb ? rb : (b ? b : ""));
}

/* Numbers a step: 0 to do it, else the errno to return without doing it. Called locked. */
static int step(ks_crash_io *c, ks_crash_op op, const char *a, const char *b) {
  if (c->crashed) return EIO;
  c->steps++;
  log_step(c, op, a, b);
  if (c->steps == c->crash_at) {
    c->crashed = 1;
    c->failed_op = (int)op;
    return EIO;
  }
  if (c->steps == c->fail_at) {
    c->failed_op = (int)op;
    return c->fail_errno;
  }
  return 0;
}

static long handle_slot(ks_crash_io *c, int fd) {
  for (size_t i = 0; i < sizeof c->handles / sizeof c->handles[0]; i++)
    if (c->handles[i].fd == fd) return (long)i;
  return -1;
}

static void append(ks_crash_node *n, const void *buf, size_t len) {
  uint8_t *v = realloc(n->vol, n->vol_len + len + 1);
  if (!v) abort();
  memcpy(v + n->vol_len, buf, len);
  n->vol = v;
  n->vol_len += len;
}

static int c_create(void *ctx, const char *path, int *fd) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_CREATE, path, NULL);
  if (!e) e = BASE->create_fn(NULL, path, fd);
  if (!e) {
    size_t n = model_add(c, path, N_FILE);
    long slot = handle_slot(c, -1);
    if (slot < 0) c->model_error = 1;
    else c->handles[slot].fd = *fd, c->handles[slot].node = n;
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  long slot = handle_slot(c, fd);
  size_t node = slot >= 0 ? c->handles[slot].node : (size_t)-1;
  int e = step(c, KS_CRASH_OP_WRITE, NULL, NULL);
  if (e && c->crashed && c->steps == c->crash_at && node != (size_t)-1)
    append(&c->nodes[node], buf, n / 2); /* a torn write: half of it reached the page cache */
  if (!e) e = BASE->write_fn(NULL, fd, buf, n, written);
  if (!e && node != (size_t)-1) append(&c->nodes[node], buf, *written);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_fsync(void *ctx, int fd) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_FSYNC, NULL, NULL);
  long slot = handle_slot(c, fd);
  if (!e && slot >= 0) {
    ks_crash_node *n = &c->nodes[c->handles[slot].node];
    free(n->dur);
    n->dur = malloc(n->vol_len + 1);
    if (!n->dur) abort();
    if (n->vol_len) memcpy(n->dur, n->vol, n->vol_len);
    n->dur_len = n->vol_len;
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_close(void *ctx, int fd) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  long slot = handle_slot(c, fd);
  /* A dead process's descriptors are closed anyway: release the real one in every case. */
  int e = slot >= 0 ? step(c, KS_CRASH_OP_CLOSE, NULL, NULL) : 0;
  int rc = BASE->close_fn(NULL, fd);
  if (slot >= 0) c->handles[slot].fd = -1;
  pthread_mutex_unlock(&c->mu);
  return e ? e : rc;
}

static int c_rename(void *ctx, const char *from, const char *to) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_RENAME, from, to);
  if (!e) e = BASE->rename_fn(NULL, from, to);
  const char *rf = rel_of(c, from), *rt = rel_of(c, to), *lf, *lt;
  size_t df, dt, node;
  if (!e && rf && rt) {
    if (!parent_of(c, rf, &df, &lf) || !parent_of(c, rt, &dt, &lt) || !node_of(c, rf, &node)) c->model_error = 1;
    else {
      set_entry(c, dt, lt, node);
      drop_entry(c, &c->nodes[df], lf);
    }
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_unlink(void *ctx, const char *path) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_UNLINK, path, NULL);
  if (!e) e = BASE->unlink_fn(NULL, path);
  const char *r = rel_of(c, path), *leaf;
  size_t dir;
  if (!e && r && parent_of(c, r, &dir, &leaf)) drop_entry(c, &c->nodes[dir], leaf);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_fsync_dir(void *ctx, const char *path) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_FSYNC_DIR, path, NULL);
  const char *r = rel_of(c, path);
  size_t node;
  if (!e && r && node_of(c, r, &node) && c->nodes[node].kind == N_DIR) {
    ks_crash_node *d = &c->nodes[node];
    memcpy(d->de, d->ve, d->nve * sizeof(ent));
    d->nde = d->nve;
    d->npend = 0;
  } else if (!e && r) c->model_error = 1;
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_mkdir(void *ctx, const char *path) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_MKDIR, path, NULL);
  if (!e) e = BASE->mkdir_fn(NULL, path);
  if (!e) model_add(c, path, N_DIR);
  pthread_mutex_unlock(&c->mu);
  return e;
}

static int c_symlink(void *ctx, const char *target, const char *path) {
  ks_crash_io *c = ctx;
  pthread_mutex_lock(&c->mu);
  int e = step(c, KS_CRASH_OP_SYMLINK, path, target);
  if (!e) e = BASE->symlink_fn(NULL, target, path);
  if (!e) {
    size_t n = model_add(c, path, N_LINK);
    if (n != (size_t)-1) snprintf(c->nodes[n].target, sizeof c->nodes[n].target, "%s", target);
  }
  pthread_mutex_unlock(&c->mu);
  return e;
}

/* Reads are not steps; after the crash they fail like everything else. */
#define READ_GUARD(c)              \
  do {                             \
    pthread_mutex_lock(&(c)->mu);  \
    int dead = (c)->crashed;       \
    pthread_mutex_unlock(&(c)->mu); \
    if (dead) return EIO;          \
  } while (0)

static int c_open(void *ctx, const char *path, int *fd, uint64_t *size) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->open_fn(NULL, path, fd, size);
}
static int c_read(void *ctx, int fd, void *buf, size_t n, uint64_t off, size_t *got) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->read_fn(NULL, fd, buf, n, off, got);
}
static int c_map(void *ctx, int fd, uint64_t size, const void **addr) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->map_fn(NULL, fd, size, addr);
}
static int c_unmap(void *ctx, const void *addr, uint64_t size) {
  (void)ctx;
  return BASE->unmap_fn(NULL, addr, size);
}
static int c_stat(void *ctx, const char *path, ks_io_stat *st) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->stat_fn(NULL, path, st);
}
static int c_list(void *ctx, const char *dir, const char *prefix, ks_io_list_cb cb, void *cb_ctx) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->list_fn(NULL, dir, prefix, cb, cb_ctx);
}
static int c_readlink(void *ctx, const char *path, char *buf, size_t cap, size_t *len) {
  READ_GUARD((ks_crash_io *)ctx);
  return BASE->readlink_fn(NULL, path, buf, cap, len);
}

void ks_crash_io_init(ks_crash_io *c, const char *root, int record) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  snprintf(c->root, sizeof c->root, "%s", root);
  c->record = record;
  c->failed_op = -1;
  for (size_t i = 0; i < sizeof c->handles / sizeof c->handles[0]; i++) c->handles[i].fd = -1;
  new_node(c, N_DIR); /* the root: exists and is durable */
  c->io = (ks_io){.version = KS_IO_VERSION, .ctx = c, .create_fn = c_create, .write_fn = c_write,
                  .fsync_fn = c_fsync, .close_fn = c_close, .rename_fn = c_rename, .unlink_fn = c_unlink,
                  .fsync_dir_fn = c_fsync_dir, .open_fn = c_open, .read_fn = c_read, .map_fn = c_map,
                  .unmap_fn = c_unmap, .stat_fn = c_stat, .list_fn = c_list, .mkdir_fn = c_mkdir,
                  .symlink_fn = c_symlink, .readlink_fn = c_readlink};
}

void ks_crash_io_free(ks_crash_io *c) {
  for (size_t i = 0; i < c->n_nodes; i++) {
    free(c->nodes[i].vol);
    free(c->nodes[i].dur);
    free(c->nodes[i].ve);
    free(c->nodes[i].de);
    free(c->nodes[i].pend);
  }
  free(c->nodes);
  free(c->log);
  pthread_mutex_destroy(&c->mu);
  memset(c, 0, sizeof *c);
}

static int write_all(const char *path, const uint8_t *p, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
  if (fd < 0) return -1;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) break;
    p += w;
    n -= (size_t)w;
  }
  return close(fd) || n ? -1 : 0;
}

static uint64_t next_rand(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* PREFIX: the durable entries with the first j pending changes applied (an ordered metadata journal). */
static size_t prefix_entries(ks_crash_node *d, ent *out, uint64_t *rng) {
  size_t n = d->nde, j = d->npend ? (size_t)(next_rand(rng) % (d->npend + 1)) : 0;
  memcpy(out, d->de, n * sizeof(ent));
  for (size_t i = 0; i < j; i++) {
    const pending *p = &d->pend[i];
    size_t k = 0;
    while (k < n && strcmp(out[k].name, p->name)) k++;
    if (p->drop) {
      if (k < n) out[k] = out[--n];
    } else if (k < n) out[k].node = p->node;
    else if (n < MAX_ENTRIES) {
      snprintf(out[n].name, sizeof out[n].name, "%s", p->name);
      out[n++].node = p->node;
    }
  }
  return n;
}

/* PREFIX: the durable data and a random part of what was appended after it (a torn tail). */
static int write_prefix_data(const char *path, const ks_crash_node *x, uint64_t *rng) {
  int appended = x->vol_len > x->dur_len && (!x->dur_len || !memcmp(x->vol, x->dur, x->dur_len));
  if (!appended) return write_all(path, x->dur, x->dur_len);
  size_t extra = (size_t)(next_rand(rng) % (x->vol_len - x->dur_len + 1));
  return write_all(path, x->vol, x->dur_len + extra);
}

static int materialise_dir(ks_crash_io *c, size_t dir, ks_crash_image image, const char *out, uint64_t *rng) {
  ks_crash_node *d = &c->nodes[dir];
  ent *v = image == KS_CRASH_DURABLE ? d->de : d->ve, *tmp = NULL;
  size_t n = image == KS_CRASH_DURABLE ? d->nde : d->nve;
  if (image == KS_CRASH_PREFIX) {
    tmp = calloc(MAX_ENTRIES, sizeof(ent));
    if (!tmp) abort();
    n = prefix_entries(d, tmp, rng);
    v = tmp;
  }
  int rc = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    char path[1024];
    ks_crash_node *x = &c->nodes[v[i].node];
    snprintf(path, sizeof path, "%s/%s", out, v[i].name);
    if (x->kind == N_LINK) rc = symlink(x->target, path);
    else if (x->kind == N_DIR) rc = mkdir(path, 0777) ? -1 : materialise_dir(c, v[i].node, image, path, rng);
    else if (image == KS_CRASH_VOLATILE) rc = write_all(path, x->vol, x->vol_len);
    else if (image == KS_CRASH_PREFIX) rc = write_prefix_data(path, x, rng);
    else rc = write_all(path, x->dur, x->dur_len);
  }
  free(tmp);
  return rc ? -1 : 0;
}

int ks_crash_io_materialise(ks_crash_io *c, ks_crash_image image, const char *out) {
  pthread_mutex_lock(&c->mu);
  uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + 1;
  int rc = materialise_dir(c, 0, image, out, &rng);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

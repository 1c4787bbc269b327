/*
 * Run directory locks on S3 (lock_fn / unlock_fn of the S3 table): a lease object, the lock's own
 * path (run_dir/.keepsake.lock), written with S3's conditional writes. Taking the lock is a PUT
 * with `If-None-Match: *`, which only one writer can win; a lease that exists is read (GET) and
 * refused while it lives, with its holder named. It lives while its holder renews it: a thread
 * rewrites it every third of its time to live with `If-Match: <the ETag of our last write>`, so a
 * renewal never overwrites a lease someone else wrote. A lease not renewed for its time to live
 * (its age measured on the server's own clock: Date minus Last-Modified), or held by a process of
 * this machine that no longer exists, is taken over with `If-Match` on the ETag read, so of two
 * managers taking over the same dead lease one wins. A lease lost to another manager stops this
 * one's uploads into the run directory (ENOLCK). Unlocking stops the renewals and deletes the
 * lease with `If-Match`, so nobody else's is removed.
 *
 * A store that ignores `If-None-Match` (the second of two such PUTs of one key also succeeds) has
 * no locks: lock_fn answers ENOTSUP and the checkpoint manager runs unlocked (or refuses, under
 * KS_CKPT_LOCK_REQUIRE), as documented for tables without locks.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/json.h"
#include "remote/curl/curl_internal.h"

#define LEASE_BODY_MAX ((size_t)4096) /* a lease object is a few hundred bytes of JSON */
#define LEASE_ATTEMPTS 4              /* rounds of create / read / take over against concurrent managers */
#define CLOCK_SLACK_MS 1000           /* Date and Last-Modified count whole seconds */
#define ID_MAX 128

struct ks__lease {
  ks__remote *r;
  char *url;   /* the lease object */
  char *dir;   /* the key prefix it guards ("run/"; "" for the bucket's root) */
  char *owner; /* the manager's line naming it */
  char etag[256]; /* of our last write of the lease (guarded by mu) */
  uint64_t renewed;  /* CLOCK_MONOTONIC ns of that write (guarded by mu) */
  int lost;          /* another manager took it over, or it was deleted (guarded by mu) */
  int stop;          /* the renewal thread is to end (guarded by mu) */
  int refs;          /* the table's slot and the uploads checking it (guarded by r->lock) */
  pthread_mutex_t mu; /* held for a renewal's request, so two renewals never race each other */
  pthread_cond_t cv;
  pthread_t thread;
  int running;
};

/* What a lease object says, and how old the server says it is. */
typedef struct lease_info {
  char etag[256];
  char owner[400], host[256], pidns[ID_MAX], boot[ID_MAX];
  int64_t pid, ttl_ms, renewed_unix_ms;
  int64_t age_ms; /* Date - Last-Modified of the answer; -1 when the server gave neither */
} lease_info;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The first line of a small system file (this machine's boot id, this process's pid namespace). */
static void read_id(const char *path, char *out, size_t cap, int link) {
  out[0] = '\0';
  if (link) {
    ssize_t n = readlink(path, out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
    return;
  }
  FILE *f = fopen(path, "re");
  if (!f) return;
  if (!fgets(out, (int)cap, f)) out[0] = '\0';
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

typedef struct self_id {
  char host[256], pidns[ID_MAX], boot[ID_MAX];
  int64_t pid;
} self_id;

static void who_am_i(self_id *me) {
  if (gethostname(me->host, sizeof me->host - 1) != 0) snprintf(me->host, sizeof me->host, "?");
  me->host[sizeof me->host - 1] = '\0';
  read_id("/proc/self/ns/pid", me->pidns, sizeof me->pidns, 1);
  read_id("/proc/sys/kernel/random/boot_id", me->boot, sizeof me->boot, 0);
  me->pid = (int64_t)getpid();
}

static void put_member_str(ks__sbuf *b, const char *key, const char *v) {
  ks__sbuf_put_json_str(b, key, strlen(key));
  ks__sbuf_putc(b, ':');
  ks__sbuf_put_json_str(b, v, strlen(v));
  ks__sbuf_putc(b, ',');
}

static void put_member_int(ks__sbuf *b, const char *key, int64_t v) {
  ks__sbuf_put_json_str(b, key, strlen(key));
  ks__sbuf_putc(b, ':');
  ks__sbuf_put_i64(b, v);
}

/* The lease's JSON: who holds it (the manager's line, and what lets this machine tell a dead holder),
 * its time to live and when it was written (for people and for stores that send no Date). */
static int lease_body(ks__remote *r, const char *owner, ks__sbuf *b) {
  self_id me;
  who_am_i(&me);
  char when[32] = "";
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  ks__sbuf_init(b, &r->alloc);
  ks__sbuf_putc(b, '{');
  put_member_str(b, "owner", owner);
  put_member_str(b, "host", me.host);
  put_member_str(b, "pid_namespace", me.pidns);
  put_member_str(b, "boot_id", me.boot);
  put_member_str(b, "renewed", when);
  put_member_int(b, "pid", me.pid);
  ks__sbuf_putc(b, ',');
  put_member_int(b, "ttl_ms", r->lock_ttl_ms);
  ks__sbuf_putc(b, ',');
  put_member_int(b, "renewed_unix_ms", unix_ms());
  ks__sbuf_puts(b, "}\n");
  if (b->failed) {
    ks__sbuf_free(b);
    return ENOMEM;
  }
  return 0;
}

/* A PUT of the lease under a condition ("If-None-Match: *", "If-Match: <etag>"); the new ETag into etag.
 * dl: the operation's deadline (0: the storage's). A condition that does not hold (412) is an answer, not
 * a failure to record; so is a missing object (404) with KS__QUIET_404 in quiet. */
static int put_lease(ks__remote *r, const char *url, const char *cond, const char *owner, char *etag, size_t ecap,
                     uint64_t dl, unsigned quiet) {
  ks__sbuf b;
  int rc = lease_body(r, owner, &b);
  if (rc) return rc;
  const char *h[] = {"Content-Type: application/json", cond};
  ks__req q = {.method = "PUT", .url = url, .headers = h, .n_headers = cond ? 2 : 1, .body = (const uint8_t *)b.p,
               .body_len = b.len, .deadline = dl};
  ks__resp p;
  rc = ks__http_do(r, &q, &p, KS__QUIET_412 | quiet);
  if (!rc && etag) snprintf(etag, ecap, "%s", p.etag);
  ks__resp_free(&p);
  ks__sbuf_free(&b);
  return rc;
}

static void copy_str(const ks__jv *doc, const char *key, char *out, size_t cap) {
  const char *s = ks__jv_string(ks__jv_get(doc, key));
  snprintf(out, cap, "%s", s ? s : "");
}

static int64_t get_int(const ks__jv *doc, const char *key) {
  int64_t v = -1;
  return ks__jv_is_int(ks__jv_get(doc, key), &v) ? v : -1;
}

/* Reads the lease at url (ENOENT when there is none). What it says is untrusted: a body that is not a
 * lease leaves the fields empty, and the lease then lives the storage's own time to live. */
static int get_lease(ks__remote *r, const char *url, lease_info *li) {
  *li = (lease_info){.pid = -1, .ttl_ms = -1, .renewed_unix_ms = -1, .age_ms = -1};
  ks__req q = {.method = "GET", .url = url, .max_body = LEASE_BODY_MAX};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, KS__QUIET_404);
  if (!rc) {
    snprintf(li->etag, sizeof li->etag, "%s", p.etag);
    int64_t now = ks__http_date(p.date), modified = ks__http_date(p.last_modified);
    if (now >= 0 && modified >= 0) li->age_ms = (now > modified ? now - modified : 0) * 1000;
    ks__jv *doc = NULL;
    if (p.body && !ks__jv_parse(&r->alloc, (const char *)p.body, p.len, "lease", &doc, NULL) &&
        ks__jv_is(doc, KS__JV_OBJECT)) {
      copy_str(doc, "owner", li->owner, sizeof li->owner);
      copy_str(doc, "host", li->host, sizeof li->host);
      copy_str(doc, "pid_namespace", li->pidns, sizeof li->pidns);
      copy_str(doc, "boot_id", li->boot, sizeof li->boot);
      li->pid = get_int(doc, "pid");
      li->ttl_ms = get_int(doc, "ttl_ms");
      li->renewed_unix_ms = get_int(doc, "renewed_unix_ms");
    }
    ks__jv_free(&r->alloc, doc);
  }
  ks__resp_free(&p);
  return rc;
}

/* The holder's process is known to be gone: it ran on this machine, since its last boot, in this pid
 * namespace, and no process has its pid (a reboot since ends every holder of this machine). */
static int holder_dead(const lease_info *li) {
  self_id me;
  who_am_i(&me);
  if (!li->host[0] || strcmp(li->host, me.host) || !li->boot[0] || !me.boot[0]) return 0;
  if (strcmp(li->boot, me.boot)) return 1;
  if (!li->pidns[0] || strcmp(li->pidns, me.pidns) || li->pid <= 0 || li->pid == me.pid || li->pid > INT32_MAX)
    return 0;
  return kill((pid_t)li->pid, 0) != 0 && errno == ESRCH;
}

static int64_t ttl_of(const ks__remote *r, const lease_info *li) {
  return li->ttl_ms > 0 && li->ttl_ms <= 30LL * 24 * 3600 * 1000 ? li->ttl_ms : r->lock_ttl_ms;
}

/* A lease past its time to live without renewal (on the server's clock, else on this one's). */
static int expired(const ks__remote *r, const lease_info *li) {
  int64_t ttl = ttl_of(r, li);
  if (holder_dead(li)) return 1;
  if (li->age_ms >= 0) return li->age_ms > ttl + CLOCK_SLACK_MS;
  return li->renewed_unix_ms > 0 && unix_ms() > li->renewed_unix_ms + ttl + CLOCK_SLACK_MS;
}

/* "pid N on host H since T; lease renewed 4 s ago, taken over after 60 s without renewal" */
static void describe_holder(const ks__remote *r, const lease_info *li, char *out, size_t cap) {
  if (!out || !cap) return;
  char age[64] = "";
  if (li->age_ms >= 0) snprintf(age, sizeof age, "renewed %lld s ago, ", (long long)(li->age_ms / 1000));
  snprintf(out, cap, "%s; lease %staken over after %lld s without renewal", li->owner[0] ? li->owner : "holder unknown",
           age, (long long)(ttl_of(r, li) / 1000));
}

/* What is known of the store's conditional writes (r->cond_writes, shared by the threads of the table). */
static int cond_writes(ks__remote *r) {
  pthread_mutex_lock(&r->lock);
  int v = r->cond_writes;
  pthread_mutex_unlock(&r->lock);
  return v;
}

static void set_cond_writes(ks__remote *r, int v) {
  pthread_mutex_lock(&r->lock);
  r->cond_writes = v;
  pthread_mutex_unlock(&r->lock);
}

/* ---- renewal ---- */

/* Rewrites the lease if it is still ours; call with l->mu held. A 412 or 404 means it is not. */
static int renew_locked(ks__lease *l) {
  char cond[300], etag[256] = "";
  snprintf(cond, sizeof cond, "If-Match: %s", l->etag);
  uint64_t dl = mono_ns() + (uint64_t)l->r->lock_ttl_ms * 1000000u / 3; /* a renewal ends before the next */
  int rc = put_lease(l->r, l->url, cond, l->owner, etag, sizeof etag, dl, KS__QUIET_404 | KS__QUIET_ALL);
  if (!rc && etag[0]) {
    snprintf(l->etag, sizeof l->etag, "%s", etag);
    l->renewed = mono_ns();
  } else if (rc == EEXIST || rc == ENOENT || (!rc && !etag[0])) {
    l->lost = 1; /* taken over or removed: never written again by this holder */
  }
  return rc;
}

static void *renewer(void *arg) {
  ks__lease *l = arg;
  uint64_t period = (uint64_t)l->r->lock_ttl_ms * 1000000u / 3;
  pthread_mutex_lock(&l->mu);
  while (!l->stop && !l->lost) {
    uint64_t due = l->renewed + period, now = mono_ns();
    if (now >= due) {
      if (!renew_locked(l)) continue;
      if (l->lost) break;
      due = mono_ns() + period / 2; /* the network failed: again sooner */
    }
    struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ---- the lease objects of one storage object ---- */

static void lease_free(ks__lease *l) {
  if (!l) return;
  if (l->running) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
  }
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  ks__free(&l->r->alloc, l->url);
  ks__free(&l->r->alloc, l->dir);
  ks__free(&l->r->alloc, l->owner);
  ks__free(&l->r->alloc, l);
}

/* The key prefix a lease at `path` guards: its directory's key and '/' ("" for the root). */
static int guarded_prefix(ks__remote *r, const char *path, char **out) {
  char *key = NULL;
  int rc = ks__s3_key(r, path, &key);
  if (rc) return rc;
  char *slash = strrchr(key, '/');
  if (slash) slash[1] = '\0';
  else key[0] = '\0';
  *out = key;
  return 0;
}

static ks__lease *lease_new(ks__remote *r, const char *path, const char *url, const char *owner) {
  ks__lease *l = ks__calloc(&r->alloc, 1, sizeof *l);
  if (!l) return NULL;
  l->r = r;
  l->url = ks__strdup(&r->alloc, url);
  l->owner = ks__strdup(&r->alloc, owner);
  pthread_condattr_t ca;
  int ok = !pthread_condattr_init(&ca);
  ok = ok && !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&l->cv, &ca);
  if (ok) pthread_condattr_destroy(&ca);
  if (!ok || pthread_mutex_init(&l->mu, NULL) || !l->url || !l->owner || guarded_prefix(r, path, &l->dir)) {
    if (ok) pthread_cond_destroy(&l->cv);
    ks__free(&r->alloc, l->url);
    ks__free(&r->alloc, l->owner);
    ks__free(&r->alloc, l);
    return NULL;
  }
  l->refs = 1;
  return l;
}

static int remove_lease(ks__remote *r, const char *url, const char *etag) {
  char cond[300];
  snprintf(cond, sizeof cond, "If-Match: %s", etag);
  const char *h[] = {cond};
  ks__req q = {.method = "DELETE", .url = url, .headers = h, .n_headers = etag[0] ? 1 : 0};
  ks__resp p;
  int rc = ks__http_do(r, &q, &p, KS__QUIET_404 | KS__QUIET_412);
  ks__resp_free(&p);
  return rc == ENOENT || rc == EEXIST ? 0 : rc; /* gone, or someone else's now: not ours to remove */
}

/* Registers a lease just written (etag) and starts its renewals; the lock handle into *handle. */
static int lease_hold(ks__remote *r, const char *path, const char *url, const char *owner, const char *etag,
                      int *handle) {
  ks__lease *l = lease_new(r, path, url, owner);
  if (!l) {
    (void)remove_lease(r, url, etag); /* written, but it cannot be held: not left to block others */
    return ENOMEM;
  }
  snprintf(l->etag, sizeof l->etag, "%s", etag);
  l->renewed = mono_ns();
  int slot = -1;
  pthread_mutex_lock(&r->lock);
  for (int i = 0; i < KS__LEASES_MAX && slot < 0; i++)
    if (!r->leases[i]) slot = i;
  if (slot >= 0) r->leases[slot] = l;
  pthread_mutex_unlock(&r->lock);
  int rc = slot < 0 ? EMFILE : 0;
  if (!rc && pthread_create(&l->thread, NULL, renewer, l)) rc = ENOMEM; /* not EAGAIN: that means "again" here */
  else if (!rc) l->running = 1;
  if (rc) {
    if (slot >= 0) {
      pthread_mutex_lock(&r->lock);
      r->leases[slot] = NULL;
      pthread_mutex_unlock(&r->lock);
    }
    lease_free(l);
    (void)remove_lease(r, url, etag); /* written, but it could not be held: not left to block others */
    return rc;
  }
  *handle = slot;
  return 0;
}

/* The conditional writes were ignored (a second If-None-Match PUT of one key succeeded): no locks. */
static int no_conditional_writes(ks__remote *r, const char *url) {
  set_cond_writes(r, -1);
  (void)remove_lease(r, url, ""); /* ours: written a moment ago, and meaningless on such a store */
  ks__remote_fail(r, "PUT %s: the store ignores If-None-Match (conditional writes), so it cannot hold "
                     "a run directory lock",
                  url);
  return ENOTSUP;
}

/* Our lease is written: on a store not known to honour If-None-Match yet, a second such PUT must fail. */
static int created(ks__remote *r, const char *path, const char *url, const char *owner, const char *etag,
                   int *handle) {
  if (!etag[0]) return no_conditional_writes(r, url); /* no ETag: no If-Match renewals either */
  if (cond_writes(r) != 1) {
    int rc = put_lease(r, url, "If-None-Match: *", owner, NULL, 0, 0, 0);
    if (rc == 0) return no_conditional_writes(r, url);
    if (rc != EEXIST) {
      (void)remove_lease(r, url, etag);
      return rc;
    }
    set_cond_writes(r, 1);
  }
  return lease_hold(r, path, url, owner, etag, handle);
}

/* One round: create the lease, else read it and refuse a live one or take over an expired one. 0 with
 * *handle; EWOULDBLOCK (holder filled); EAGAIN to go round again (it changed meanwhile); an errno. */
static int lock_round(ks__remote *r, const char *path, const char *url, const char *owner, int *handle,
                      char *holder, size_t cap) {
  char etag[256] = "", cond[300];
  int rc = put_lease(r, url, "If-None-Match: *", owner, etag, sizeof etag, 0, 0);
  if (rc == 0) return created(r, path, url, owner, etag, handle);
  if (rc == ENOTSUP) return no_conditional_writes(r, url); /* 501: the header is not implemented */
  if (rc != EEXIST) return rc;
  set_cond_writes(r, 1); /* a 412 is the condition honoured */
  lease_info li;
  rc = get_lease(r, url, &li);
  if (rc == ENOENT) return EAGAIN; /* released meanwhile */
  if (rc) return rc;
  describe_holder(r, &li, holder, cap);
  if (!expired(r, &li)) return EWOULDBLOCK;
  if (!li.etag[0]) return EWOULDBLOCK; /* nothing to take over on */
  snprintf(cond, sizeof cond, "If-Match: %s", li.etag);
  rc = put_lease(r, url, cond, owner, etag, sizeof etag, 0, KS__QUIET_404);
  if (rc == EEXIST || rc == ENOENT) return EAGAIN; /* renewed, taken or released meanwhile */
  if (rc) return rc;
  /* A store that ignored If-Match lets two managers take over at once: the lease must read back as ours. */
  lease_info now;
  rc = get_lease(r, url, &now);
  if (rc == ENOENT || (!rc && strcmp(now.etag, etag))) return EAGAIN;
  return rc ? rc : lease_hold(r, path, url, owner, etag, handle);
}

int ks__s3_lock_fn(void *ctx, const char *path, const char *owner, int *handle, char *holder, size_t cap) {
  ks__remote *r = ctx;
  if (holder && cap) holder[0] = '\0';
  if (r->lock_ttl_ms <= 0 || cond_writes(r) < 0) return ENOTSUP;
  char *url = NULL, line[512];
  snprintf(line, sizeof line, "%s", owner ? owner : "");
  line[strcspn(line, "\r\n")] = '\0'; /* the manager's line ends with one */
  int rc = ks__s3_url(r, path, NULL, &url);
  for (int i = 0; !rc || rc == EAGAIN; i++) {
    if (i == LEASE_ATTEMPTS) {
      rc = EWOULDBLOCK; /* it keeps changing hands: someone else is busy with it */
      break;
    }
    rc = lock_round(r, path, url, line, handle, holder, cap);
    if (!rc) break;
  }
  ks__free(&r->alloc, url);
  return rc;
}

/* Takes the lease of handle h out of the table (NULL when there is none). */
static ks__lease *take(ks__remote *r, int h) {
  ks__lease *l = NULL;
  pthread_mutex_lock(&r->lock);
  if (h >= 0 && h < KS__LEASES_MAX) {
    l = r->leases[h];
    r->leases[h] = NULL;
  }
  pthread_mutex_unlock(&r->lock);
  return l;
}

/* Drops one reference; the last one frees the lease. */
static void unref(ks__remote *r, ks__lease *l) {
  pthread_mutex_lock(&r->lock);
  int last = --l->refs == 0;
  pthread_mutex_unlock(&r->lock);
  if (last) lease_free(l);
}

int ks__s3_unlock_fn(void *ctx, int handle) {
  ks__remote *r = ctx;
  ks__lease *l = take(r, handle);
  if (!l) return EBADF;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_signal(&l->cv);
  int lost = l->lost;
  char etag[256];
  snprintf(etag, sizeof etag, "%s", l->etag);
  pthread_mutex_unlock(&l->mu);
  int rc = lost ? 0 : remove_lease(r, l->url, etag);
  unref(r, l);
  return rc;
}

/* A lease whose guarded prefix holds key, with a reference taken; NULL when none. */
static ks__lease *guarding(ks__remote *r, const char *key) {
  ks__lease *l = NULL;
  pthread_mutex_lock(&r->lock);
  for (int i = 0; i < KS__LEASES_MAX && !l; i++) {
    ks__lease *c = r->leases[i];
    if (c && !strncmp(key, c->dir, strlen(c->dir))) l = c;
  }
  if (l) l->refs++;
  pthread_mutex_unlock(&r->lock);
  return l;
}

int ks__lease_check(ks__remote *r, const char *path) {
  if (r->lock_ttl_ms <= 0) return 0;
  char *key = NULL;
  if (ks__s3_key(r, path, &key)) return 0; /* out of memory: the upload will say so */
  ks__lease *l = guarding(r, key);
  ks__free(&r->alloc, key);
  if (!l) return 0;
  uint64_t period = (uint64_t)r->lock_ttl_ms * 1000000u / 3;
  pthread_mutex_lock(&l->mu);
  if (!l->lost && mono_ns() - l->renewed > period) (void)renew_locked(l); /* renewed by the saves, too */
  int lost = l->lost;
  pthread_mutex_unlock(&l->mu);
  if (lost)
    ks__remote_fail(r, "the run directory's lock s3://%s/%s.keepsake.lock was taken over by another checkpoint "
                       "manager (or removed); this one writes nothing more there",
                    r->bucket, l->dir);
  unref(r, l);
  return lost ? ENOLCK : 0;
}

void ks__leases_free(ks__remote *r) {
  for (int i = 0; i < KS__LEASES_MAX; i++) {
    ks__lease *l = take(r, i);
    if (l) unref(r, l);
  }
}

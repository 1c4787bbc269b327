/*
 * Test hook: KS_TEST_KILL_IN_SAVE="<n>:<bytes>" makes the n-th save of this
 * process SIGKILL itself once <bytes> bytes of the temporary file are written,
 * a crash in the middle of a save at a reproducible point. Everything else is
 * passed to the POSIX I/O layer.
 *
 * KS_TEST_SAVE_DELAY_MS=<ms> makes every write of a save sleep first, so a save
 * (a background one in particular) is still in flight when the run is halted.
 * KS_TEST_FAIL_SAVE=<n> makes every write of the n-th save fail with ENOSPC, a full disk.
 * KS_TEST_KILL_RANK=<r> applies the kill, delay, failure and halt hooks to rank r only (under mpirun).
 * KS_TEST_SIGNAL_AT="<batch>:<signal number>" makes the process send itself the
 * signal right after that batch, a preemption at a reproducible point.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "digits.h"

typedef struct kill_ctx {
  long target_save, saves;
  size_t kill_at, written;
  long delay_ms;
  long fail_save;
} kill_ctx;

static kill_ctx g_kill;
static ks_io g_io;
static int g_rank;

void digits_test_set_rank(int rank) { g_rank = rank; }

int digits_test_this_rank(void) {
  const char *only = getenv("KS_TEST_KILL_RANK");
  return !only || atoi(only) == g_rank;
}

static int k_create(void *ctx, const char *path, int *fd) {
  kill_ctx *k = ctx;
  k->saves++;
  k->written = 0;
  return ks_io_posix()->create_fn(ks_io_posix()->ctx, path, fd);
}

static int k_write(void *ctx, int fd, const void *buf, size_t n, size_t *written) {
  kill_ctx *k = ctx;
  const ks_io *p = ks_io_posix();
  if (k->delay_ms) usleep((useconds_t)k->delay_ms * 1000);
  if (k->fail_save && k->saves == k->fail_save) return ENOSPC;
  if (k->saves != k->target_save || k->written + n < k->kill_at) {
    int e = p->write_fn(p->ctx, fd, buf, n, written);
    k->written += *written;
    return e;
  }
  size_t part = k->kill_at - k->written;
  int e = p->write_fn(p->ctx, fd, buf, part, written);
  (void)e;
  kill(getpid(), SIGKILL);
  pause();
  return 0;
}

const ks_io *digits_test_io(void) {
  const char *spec = getenv("KS_TEST_KILL_IN_SAVE"), *delay = getenv("KS_TEST_SAVE_DELAY_MS");
  const char *failing = getenv("KS_TEST_FAIL_SAVE");
  long fail_n = failing ? atol(failing) : 0;
  long n = 0;
  size_t bytes = 0;
  int kill_spec = spec && sscanf(spec, "%ld:%zu", &n, &bytes) == 2 && n > 0;
  long ms = delay ? atol(delay) : 0;
  if ((!kill_spec && ms <= 0 && fail_n <= 0) || !digits_test_this_rank()) return NULL;
  g_kill = (kill_ctx){.target_save = kill_spec ? n : 0, .kill_at = bytes, .delay_ms = ms > 0 ? ms : 0,
                      .fail_save = fail_n > 0 ? fail_n : 0};
  g_io = *ks_io_posix(); /* what is not replaced below goes to the file system unchanged */
  g_io.ctx = &g_kill;
  g_io.create_fn = k_create;
  g_io.write_fn = k_write;
  return &g_io;
}

void digits_test_after_batch(long long batch) {
  const char *spec = getenv("KS_TEST_SIGNAL_AT");
  long long at;
  int sig;
  if (spec && sscanf(spec, "%lld:%d", &at, &sig) == 2 && at == batch && digits_test_this_rank()) raise(sig);
}

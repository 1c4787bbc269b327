/*
 * Preemption: SIGTERM (or another chosen signal) asks the run to save at the
 * next batch boundary and exit. The handler only records the signal (and calls
 * the handler it replaced); all work happens in the training loop. A signal
 * disposition is process-wide, so the state kept here is too, the library's
 * only process-wide state: the recorded signal, and per signal the number of
 * installs not yet undone and the disposition the first one replaced, which the
 * last uninstall puts back. Only signals received while an install is in force
 * are acted on: the record is cleared when the first install begins (and when
 * the last one ends), as Lightning's and torchelastic's handlers do.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "manager/manager_internal.h"

#ifndef NSIG
#define NSIG 65
#endif

static volatile sig_atomic_t preempt_signal;
/* Guarded by `lock`; `saved` is also read by the handler, for a signal whose count is nonzero. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int installs[NSIG];           /* per signal: installs not yet undone */
static struct sigaction saved[NSIG]; /* per signal: the disposition the first install replaced */
static size_t in_force;              /* sum of installs: 0 when no manager listens */

static void on_preempt(int sig, siginfo_t *info, void *uctx) {
  preempt_signal = sig;
  if (sig <= 0 || sig >= NSIG) return;
  /* The program's own handler (Python's, a scheduler's) runs too; SIG_DFL and SIG_IGN are what
   * preemption replaces: the run saves and exits 75 instead. */
  const struct sigaction *old = &saved[sig];
  if (old->sa_flags & SA_SIGINFO) {
    if (old->sa_sigaction) old->sa_sigaction(sig, info, uctx);
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
  }
}

static KS_NODISCARD ks_status check_signals(const int *signals, size_t n, ks_error *err) {
  if (!signals || !n) return ks__err(err, KS_E_INVALID, "preemption: no signals given");
  for (size_t i = 0; i < n; i++)
    if (signals[i] <= 0 || signals[i] >= NSIG || signals[i] == SIGKILL || signals[i] == SIGSTOP)
      return ks__err(err, KS_E_INVALID, "preemption: signal %d cannot be caught", signals[i]);
  return KS_OK;
}

/* Blocks the signals of the list in this thread while the tables change (the handler reads them). */
static void block(const int *signals, size_t n, sigset_t *prev) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < n; i++) sigaddset(&set, signals[i]);
  pthread_sigmask(SIG_BLOCK, &set, prev);
}

/* Puts back what the first install of `sig` replaced, unless the program has installed another
 * disposition since (then that one stays). errno-style. */
static int restore(int sig) {
  struct sigaction cur;
  if (sigaction(sig, NULL, &cur)) return errno;
  if (!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_preempt) return 0;
  return sigaction(sig, &saved[sig], NULL) ? errno : 0;
}

/* Undoes one install of signals[0..n): the last one of a signal restores its disposition. */
static int undo(const int *signals, size_t n) {
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    int sig = signals[i];
    if (installs[sig] <= 0) continue;
    if (--installs[sig] == 0) {
      int r = restore(sig);
      if (!rc) rc = r; /* saved[sig] stays as it is: a handler running in another thread may read it */
    }
    in_force--;
  }
  if (!in_force) preempt_signal = 0;
  return rc;
}

ks_status ks_preemption_install(const int *signals, size_t n, ks_error *err) {
  ks_status s = check_signals(signals, n, err);
  if (s) return s;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_preempt;
  sa.sa_flags = SA_RESTART | SA_SIGINFO; /* a write interrupted by the signal goes on */
  sigemptyset(&sa.sa_mask);
  sigset_t prev;
  block(signals, n, &prev);
  pthread_mutex_lock(&lock);
  if (!in_force) preempt_signal = 0; /* a signal from before any manager listened is not acted on */
  size_t done = 0;
  int rc = 0;
  for (; done < n; done++) {
    int sig = signals[done];
    /* saved[sig] is written by the kernel in the same call that installs the handler */
    if (installs[sig] == 0 && sigaction(sig, &sa, &saved[sig])) {
      rc = errno;
      break;
    }
    installs[sig]++;
    in_force++;
  }
  if (rc) (void)undo(signals, done); /* all or nothing */
  pthread_mutex_unlock(&lock);
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  if (rc) return ks__err(err, KS_E_IO, "preemption: sigaction(%d): %s", signals[done], strerror(rc));
  return KS_OK;
}

ks_status ks_preemption_uninstall(const int *signals, size_t n, ks_error *err) {
  ks_status s = check_signals(signals, n, err);
  if (s) return s;
  sigset_t prev;
  block(signals, n, &prev);
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n && !s; i++)
    if (installs[signals[i]] <= 0)
      s = ks__err(err, KS_E_STATE, "preemption: signal %d is not installed", signals[i]);
  int rc = s ? 0 : undo(signals, n);
  pthread_mutex_unlock(&lock);
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  if (s) return s;
  if (rc) return ks__err(err, KS_E_IO, "preemption: restoring a signal disposition: %s", strerror(rc));
  return KS_OK;
}

int ks_preemption_signal(void) { return (int)preempt_signal; }

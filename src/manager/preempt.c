/*
 * Preemption: SIGTERM (or another chosen signal) asks the run to save at the
 * next batch boundary and exit. The handler only records the signal; all work
 * happens in the training loop. A signal disposition is process-wide, so the
 * one flag it sets is too: the only process-wide state of the library.
 */
#include <signal.h>
#include <string.h>
#include <errno.h>

#include "manager/manager_internal.h"

static volatile sig_atomic_t preempt_signal;

static void on_preempt(int sig) { preempt_signal = sig; }

ks_status ks_preemption_install(const int *signals, size_t n, ks_error *err) {
  if (!signals || !n) return ks__err(err, KS_E_INVALID, "preemption: no signals given");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_preempt;
  sa.sa_flags = SA_RESTART; /* a write interrupted by the signal goes on */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < n; i++) {
    if (signals[i] <= 0 || signals[i] == SIGKILL || signals[i] == SIGSTOP)
      return ks__err(err, KS_E_INVALID, "preemption: signal %d cannot be caught", signals[i]);
    if (sigaction(signals[i], &sa, NULL))
      return ks__err(err, KS_E_IO, "preemption: sigaction(%d): %s", signals[i], strerror(errno));
  }
  return KS_OK;
}

int ks_preemption_signal(void) { return (int)preempt_signal; }

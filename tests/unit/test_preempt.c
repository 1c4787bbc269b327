/*
 * Preemption handlers (ks_preemption_install / ks_preemption_uninstall): the handler a program
 * had still runs (chained), installs are counted so two managers can be open, the last
 * uninstall puts the previous disposition back, and only signals received while an install is
 * in force are acted on.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "keepsake/keepsake.h"

static volatile sig_atomic_t program_calls;
static void program_handler(int sig) {
  (void)sig;
  program_calls++;
}

static void set_handler(int sig, void (*fn)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(sig, &sa, NULL), 0);
}

static void (*handler_of(int sig))(int) {
  struct sigaction cur;
  assert_int_equal(sigaction(sig, NULL, &cur), 0);
  return (cur.sa_flags & SA_SIGINFO) ? NULL : cur.sa_handler;
}

static void test_chains_counts_and_restores(void **state) {
  (void)state;
  const int sig[] = {SIGUSR1};
  ks_error e;
  set_handler(SIGUSR1, program_handler);
  program_calls = 0;
  assert_int_equal(ks_preemption_install(sig, 1, &e), KS_OK); /* a first manager */
  assert_int_equal(ks_preemption_signal(), 0);
  raise(SIGUSR1);
  assert_int_equal(ks_preemption_signal(), SIGUSR1); /* recorded ... */
  assert_int_equal(program_calls, 1);                /* ... and the program's handler ran */
  assert_int_equal(ks_preemption_install(sig, 1, &e), KS_OK); /* a second one: nothing forgotten */
  assert_int_equal(ks_preemption_signal(), SIGUSR1);
  assert_int_equal(ks_preemption_uninstall(sig, 1, &e), KS_OK); /* one closes: the other still listens */
  assert_true(handler_of(SIGUSR1) == NULL);
  assert_int_equal(ks_preemption_signal(), SIGUSR1);
  raise(SIGUSR1);
  assert_int_equal(program_calls, 2);
  assert_int_equal(ks_preemption_uninstall(sig, 1, &e), KS_OK); /* the last one: the program's handler is back */
  assert_true(handler_of(SIGUSR1) == program_handler);
  assert_int_equal(ks_preemption_signal(), 0);
  raise(SIGUSR1);
  assert_int_equal(program_calls, 3);
  assert_int_equal(ks_preemption_signal(), 0); /* not acted on: no manager listens */
  assert_int_equal(ks_preemption_uninstall(sig, 1, &e), KS_E_STATE);
  set_handler(SIGUSR1, SIG_DFL);
}

static void test_default_disposition_comes_back(void **state) {
  (void)state;
  const int sig[] = {SIGUSR2, SIGTERM};
  ks_error e;
  set_handler(SIGUSR2, SIG_DFL);
  set_handler(SIGTERM, SIG_DFL);
  assert_int_equal(ks_preemption_install(sig, 2, &e), KS_OK);
  raise(SIGTERM); /* recorded, not fatal */
  assert_int_equal(ks_preemption_signal(), SIGTERM);
  assert_int_equal(ks_preemption_uninstall(sig, 2, &e), KS_OK);
  assert_true(handler_of(SIGUSR2) == SIG_DFL);
  assert_true(handler_of(SIGTERM) == SIG_DFL);
  assert_int_equal(ks_preemption_signal(), 0);
  /* A signal recorded before a manager opens is not acted on by it. */
  assert_int_equal(ks_preemption_install(sig, 2, &e), KS_OK);
  assert_int_equal(ks_preemption_signal(), 0);
  assert_int_equal(ks_preemption_uninstall(sig, 2, &e), KS_OK);
}

static void test_a_later_program_handler_stays(void **state) {
  (void)state;
  const int sig[] = {SIGUSR1};
  ks_error e;
  set_handler(SIGUSR1, SIG_DFL);
  assert_int_equal(ks_preemption_install(sig, 1, &e), KS_OK);
  set_handler(SIGUSR1, program_handler); /* the program replaced it meanwhile: its choice stands */
  assert_int_equal(ks_preemption_uninstall(sig, 1, &e), KS_OK);
  assert_true(handler_of(SIGUSR1) == program_handler);
  set_handler(SIGUSR1, SIG_DFL);
}

static void test_bad_signals(void **state) {
  (void)state;
  ks_error e;
  const int kill[] = {SIGKILL}, zero[] = {0}, big[] = {100000}, mixed[] = {SIGUSR1, SIGSTOP};
  assert_int_equal(ks_preemption_install(kill, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_install(zero, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_install(big, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_install(mixed, 2, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_install(mixed, 0, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_uninstall(big, 1, &e), KS_E_INVALID);
  assert_int_equal(ks_preemption_uninstall(mixed, 1, &e), KS_E_STATE); /* never installed */
  assert_true(handler_of(SIGUSR1) == SIG_DFL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chains_counts_and_restores),
      cmocka_unit_test(test_default_disposition_comes_back),
      cmocka_unit_test(test_a_later_program_handler_stays),
      cmocka_unit_test(test_bad_signals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

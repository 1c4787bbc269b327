/* The C helpers of tests/common/remoteenv.h against the running test servers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "remoteenv.h"
#include "testutil.h"

static void loads_every_key(void **state) {
  (void)state;
  assert_int_equal(ks_test_remote_env_load(), 0);
  assert_int_equal(strncmp(ks_test_remote("KS_TEST_S3_ENDPOINT"), "http://127.0.0.1:", 17), 0);
  assert_int_equal(strncmp(ks_test_remote("KS_TEST_PROXY_S3"), "http://127.0.0.1:", 17), 0);
  assert_string_equal(ks_test_remote("AWS_ACCESS_KEY_ID"), "testing");
  assert_string_equal(ks_test_remote("KS_TEST_NO_SUCH_KEY"), "");
}

static void buckets_faults_and_log(void **state) {
  (void)state;
  assert_int_equal(ks_test_remote_env_load(), 0);
  assert_int_equal(ks_test_remote_bucket("c-helper"), 0);
  assert_int_equal(ks_test_remote_log_clear(), 0);
  assert_int_equal(ks_test_remote_faults("[{\"target\":\"http\",\"path_re\":\"^/c-helper$\",\"action\":\"status\","
                                         "\"status\":503,\"times\":1}]"),
                   0);
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' '%s/c-helper'",
           ks_test_remote("KS_TEST_PROXY_HTTP"));
  assert_int_equal(ks_test_run(cmd, &out), 0);
  assert_string_equal(out, "503"); /* the rule applies once */
  free(out);
  assert_int_equal(ks_test_run(cmd, &out), 0);
  assert_string_equal(out, "404"); /* then nginx answers: no such file */
  free(out);
  char *log = ks_test_remote_log();
  assert_non_null(log);
  assert_non_null(strstr(log, "\"status\": 503"));
  assert_non_null(strstr(log, "\"status\": 404"));
  free(log);
  assert_int_equal(ks_test_remote_faults("['quote']"), -1); /* refused before reaching the shell */
  assert_int_equal(ks_test_remote_faults("[{\"action\":\"explode\"}]"), -1); /* the proxy says 400 */
  assert_int_equal(ks_test_remote_faults_clear(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(loads_every_key),
      cmocka_unit_test(buckets_faults_and_log),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The run-time loader of libcurl (src/remote/curl/curl_load.c, what a KS_CURL_RUNTIME build such as
 * the wheel uses), compiled into this test on its own: no libcurl is linked here. An absent library
 * and one that is not a libcurl are refused with a message that says what to install, leaving the
 * function table empty; the system's libcurl.so.4 (the first name that opens) fills it and works. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "remote/curl/curl_load.h"

static void assert_contains(const char *s, const char *part) {
  if (!strstr(s, part)) fail_msg("\"%s\" does not contain \"%s\"", s, part);
}

static void an_absent_library_says_what_to_install(void **state) {
  (void)state;
  const char *const names[] = {"libks-test-absent-curl.so.4", NULL};
  char msg[1024] = "";
  assert_int_equal(ks__curl_load(names, msg, sizeof msg), -1);
  assert_contains(msg, "s3:// and http(s):// locations need libks-test-absent-curl.so.4");
  assert_contains(msg, "libks-test-absent-curl.so.4: cannot open shared object file");
  assert_contains(msg, "apt install libcurl4");
  assert_contains(msg, "dnf install libcurl");
  assert_null(ks__curl.easy_init);
  assert_null(ks__curl.easy_setopt);
}

static void a_library_that_is_not_libcurl_is_refused(void **state) {
  (void)state;
  const char *const names[] = {"libm.so.6", NULL};
  char msg[1024] = "";
  assert_int_equal(ks__curl_load(names, msg, sizeof msg), -1);
  assert_contains(msg, "libm.so.6 has no curl_global_init");
  assert_contains(msg, "apt install libcurl4");
  assert_null(ks__curl.global_init);
}

static void the_first_name_that_opens_is_used(void **state) {
  (void)state;
  const char *const names[] = {"libks-test-absent-curl.so.4", "libcurl.so.4", NULL};
  char msg[1024] = "";
  if (ks__curl_load(names, msg, sizeof msg)) fail_msg("%s", msg);
  const curl_version_info_data *v = ks__curl.version_info(CURLVERSION_NOW);
  assert_non_null(v);
  assert_true(v->version_num >= KS__CURL_MIN_VERSION);
  assert_int_equal(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
  CURL *h = curl_easy_init();
  assert_non_null(h);
  /* The variadic setopt through the table: a known option is taken, an invalid value refused. */
  assert_int_equal(curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https"), CURLE_OK);
  assert_int_equal(curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "no-such-protocol"), CURLE_UNSUPPORTED_PROTOCOL);
  /* Nothing listens on port 1 of 127.0.0.1: the transfer fails at connect, with curl's own words. */
  assert_int_equal(curl_easy_setopt(h, CURLOPT_URL, "http://127.0.0.1:1/x"), CURLE_OK);
  assert_int_equal(curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http"), CURLE_OK);
  assert_int_equal(curl_easy_perform(h), CURLE_COULDNT_CONNECT);
  assert_string_equal(curl_easy_strerror(CURLE_COULDNT_CONNECT), "Couldn't connect to server");
  struct curl_slist *l = curl_slist_append(NULL, "X-A: 1");
  assert_non_null(l);
  assert_non_null(curl_slist_append(l, "X-B: 2"));
  assert_string_equal(l->next->data, "X-B: 2");
  curl_slist_free_all(l);
  curl_easy_reset(h);
  curl_easy_cleanup(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(an_absent_library_says_what_to_install),
      cmocka_unit_test(a_library_that_is_not_libcurl_is_refused),
      cmocka_unit_test(the_first_name_that_opens_is_used),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

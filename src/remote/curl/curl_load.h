/*
 * libcurl loaded at run time (a KS_CURL_RUNTIME build): the backend is compiled against curl's
 * headers but links no libcurl; the few functions it calls are looked up with dlopen / dlsym in
 * the one-time init (ks__curl_init_once). Without KS_CURL_RUNTIME this header adds nothing and
 * the curl_* names are libcurl's own.
 */
#ifndef KS_REMOTE_CURL_LOAD_H
#define KS_REMOTE_CURL_LOAD_H

#include <stddef.h>

#include <curl/curl.h>

#ifdef KS_CURL_RUNTIME

/* The oldest libcurl the backend's options need (CURLOPT_PROTOCOLS_STR, CURLOPT_AWS_SIGV4). */
#define KS__CURL_MIN_VERSION 0x075500 /* 7.85.0 */
#define KS__CURL_MIN_VERSION_STR "7.85.0"

typedef struct ks__curl_fns {
  CURLcode (*global_init)(long flags);
  CURL *(*easy_init)(void);
  CURLcode (*easy_setopt)(CURL *h, CURLoption opt, ...);
  CURLcode (*easy_perform)(CURL *h);
  void (*easy_cleanup)(CURL *h);
  void (*easy_reset)(CURL *h);
  const char *(*easy_strerror)(CURLcode c);
  struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
  void (*slist_free_all)(struct curl_slist *l);
  curl_version_info_data *(*version_info)(CURLversion v);
} ks__curl_fns;

/* Filled by ks__curl_load; read-only afterwards. */
extern ks__curl_fns ks__curl;

/* Loads the first of names (NULL-terminated; NULL: libcurl.so.4, then libcurl-gnutls.so.4) that
 * opens, resolves every function of ks__curl from it and checks its version. 0; or -1 with the
 * reason in msg (cap bytes), ks__curl then left as it was. Not thread safe: called once, from
 * ks__curl_init_once's pthread_once (tests may call it directly before any remote location). */
int ks__curl_load(const char *const *names, char *msg, size_t cap);

/* The backend's calls go through the table (typecheck-gcc.h's checking macro is dropped). */
#undef curl_easy_setopt
#define curl_global_init ks__curl.global_init
#define curl_easy_init ks__curl.easy_init
#define curl_easy_setopt ks__curl.easy_setopt
#define curl_easy_perform ks__curl.easy_perform
#define curl_easy_cleanup ks__curl.easy_cleanup
#define curl_easy_reset ks__curl.easy_reset
#define curl_easy_strerror ks__curl.easy_strerror
#define curl_slist_append ks__curl.slist_append
#define curl_slist_free_all ks__curl.slist_free_all
#define curl_version_info ks__curl.version_info

#endif /* KS_CURL_RUNTIME */

#endif

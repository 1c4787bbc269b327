/*
 * libcurl looked up at run time (KS_CURL_RUNTIME): the manylinux wheel cannot bundle a libcurl
 * (a distribution's needs a newer glibc than the wheel's tag allows), so it uses the system's
 * libcurl.so.4 when a remote location is first opened, and says how to install it when absent.
 */
#include "remote/curl/curl_load.h"

#ifdef KS_CURL_RUNTIME

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

ks__curl_fns ks__curl;

#define INSTALL_HINT "install libcurl (Debian/Ubuntu: apt install libcurl4; Fedora/RHEL: dnf install libcurl)"

/* dlsym's object pointer into a function pointer, without the conversion ISO C leaves undefined. */
static int sym(void *lib, const char *so, const char *name, void *fn, size_t fn_size, char *msg, size_t cap) {
  dlerror();
  void *p = dlsym(lib, name);
  if (!p) {
    const char *why = dlerror();
    snprintf(msg, cap, "%s has no %s (%s): it is not a usable libcurl; %s", so, name, why ? why : "not found",
             INSTALL_HINT);
    return -1;
  }
  memcpy(fn, &p, fn_size);
  return 0;
}

#define SYM(field, name) sym(lib, so, name, &f.field, sizeof f.field, msg, cap)

int ks__curl_load(const char *const *names, char *msg, size_t cap) {
  static const char *const dflt[] = {"libcurl.so.4", "libcurl-gnutls.so.4", NULL};
  if (!names || !names[0]) names = dflt;
  void *lib = NULL;
  const char *so = NULL;
  char first[512] = "";
  for (size_t i = 0; names[i] && !lib; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) so = names[i];
    else if (i == 0) {
      const char *why = dlerror();
      snprintf(first, sizeof first, "%s", why ? why : names[0]);
    }
  }
  if (!lib) {
    snprintf(msg, cap,
             "s3:// and http(s):// locations need %s at run time (this keepsake loads the system's libcurl "
             "instead of linking one) and it could not be loaded (%s): %s",
             names[0], first, INSTALL_HINT);
    return -1;
  }
  ks__curl_fns f;
  memset(&f, 0, sizeof f);
  /* The library stays loaded for the life of the process, as a linked one would: never dlclose'd
     once it served, and on failure closed before anything of it was used. */
  if (SYM(global_init, "curl_global_init") || SYM(easy_init, "curl_easy_init") ||
      SYM(easy_setopt, "curl_easy_setopt") || SYM(easy_perform, "curl_easy_perform") ||
      SYM(easy_cleanup, "curl_easy_cleanup") || SYM(easy_reset, "curl_easy_reset") ||
      SYM(easy_strerror, "curl_easy_strerror") || SYM(slist_append, "curl_slist_append") ||
      SYM(slist_free_all, "curl_slist_free_all") || SYM(version_info, "curl_version_info")) {
    dlclose(lib);
    return -1;
  }
  const curl_version_info_data *v = f.version_info(CURLVERSION_NOW);
  if (!v || v->version_num < KS__CURL_MIN_VERSION) {
    snprintf(msg, cap, "%s is libcurl %s; s3:// and http(s):// locations need libcurl " KS__CURL_MIN_VERSION_STR
             " or later: %s", so, v && v->version ? v->version : "(unknown version)", INSTALL_HINT);
    dlclose(lib);
    return -1;
  }
  ks__curl = f;
  return 0;
}

#else
typedef int ks__curl_load_unused; /* a linked libcurl: nothing to load (ISO C wants a declaration) */
#endif

#include "remoteenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const char *const required[] = {"KS_TEST_S3_ENDPOINT", "KS_TEST_HTTP_URL", "KS_TEST_HTTP_ROOT",
                                       "KS_TEST_PROXY_S3",    "KS_TEST_PROXY_HTTP", "KS_TEST_PROXY_CTL",
                                       "AWS_ACCESS_KEY_ID",   "AWS_SECRET_ACCESS_KEY", "AWS_REGION"};

/* Splits one "KEY=VALUE\n" line in place and setenv()s it; blank lines and comments are skipped. */
static int load_line(char *line) {
  line[strcspn(line, "\r\n")] = '\0';
  if (line[0] == '\0' || line[0] == '#') return 0;
  char *eq = strchr(line, '=');
  if (!eq || eq == line) return -1;
  *eq = '\0';
  return setenv(line, eq + 1, 1);
}

int ks_test_remote_env_load(void) {
  const char *path = getenv("KS_REMOTE_ENV");
  if (!path || !*path) {
    fprintf(stderr, "KS_REMOTE_ENV is not set: run this test through ctest (fixture remote_servers)\n");
    return -1;
  }
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "cannot read %s (KS_REMOTE_ENV)\n", path);
    return -1;
  }
  char line[4096];
  int rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) rc = load_line(line);
  fclose(f);
  for (size_t i = 0; rc == 0 && i < sizeof required / sizeof required[0]; i++)
    if (!getenv(required[i])) {
      fprintf(stderr, "%s lacks %s\n", path, required[i]);
      rc = -1;
    }
  return rc;
}

const char *ks_test_remote(const char *key) {
  const char *v = getenv(key);
  return v ? v : "";
}

/* Runs a curl command line built from fmt; 0 when curl exits 0 (HTTP errors fail it). */
static int curl_ok(const char *cmd) {
  char *out = NULL;
  int rc = ks_test_run(cmd, &out);
  if (rc != 0) fprintf(stderr, "%s\n-> exit %d: %s\n", cmd, rc, out ? out : "");
  free(out);
  return rc == 0 ? 0 : -1;
}

int ks_test_remote_bucket(const char *name) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "curl -sS --fail-with-body --aws-sigv4 'aws:amz:%s:s3' --user '%s:%s' -X PUT '%s/%s' -o /dev/null",
           ks_test_remote("AWS_REGION"), ks_test_remote("AWS_ACCESS_KEY_ID"),
           ks_test_remote("AWS_SECRET_ACCESS_KEY"), ks_test_remote("KS_TEST_S3_ENDPOINT"), name);
  return curl_ok(cmd);
}

int ks_test_remote_faults(const char *json) {
  if (strchr(json, '\'')) return -1; /* the rules go on a shell command line in single quotes */
  size_t cap = strlen(json) + 512;
  char *cmd = malloc(cap);
  if (!cmd) return -1;
  snprintf(cmd, cap,
           "curl -sS --fail-with-body -X POST -H 'Content-Type: application/json' --data-binary '%s' '%s/faults' "
           "-o /dev/null",
           json, ks_test_remote("KS_TEST_PROXY_CTL"));
  int rc = curl_ok(cmd);
  free(cmd);
  return rc;
}

int ks_test_remote_faults_clear(void) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "curl -sS --fail-with-body -X DELETE '%s/faults' -o /dev/null",
           ks_test_remote("KS_TEST_PROXY_CTL"));
  return curl_ok(cmd);
}

char *ks_test_remote_log(void) {
  char cmd[1024], *out = NULL;
  snprintf(cmd, sizeof cmd, "curl -sS --fail-with-body '%s/log'", ks_test_remote("KS_TEST_PROXY_CTL"));
  if (ks_test_run(cmd, &out) != 0) {
    free(out);
    return NULL;
  }
  return out;
}

int ks_test_remote_log_clear(void) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "curl -sS --fail-with-body -X DELETE '%s/log' -o /dev/null",
           ks_test_remote("KS_TEST_PROXY_CTL"));
  return curl_ok(cmd);
}

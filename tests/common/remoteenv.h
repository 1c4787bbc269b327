/*
 * Helpers for C tests that use the remote test servers (the ctest fixture remote_servers in
 * tests/remote): load $KS_REMOTE_ENV (servers.env: KS_TEST_S3_ENDPOINT, KS_TEST_PROXY_S3, ...,
 * AWS_*) into the environment, create buckets and set the fault proxy's rules. The requests are
 * made by the curl program (S3 ones signed with --aws-sigv4), so the helpers need no libcurl.
 */
#ifndef KS_REMOTEENV_H
#define KS_REMOTEENV_H

/*
 * Reads the KEY=VALUE lines of $KS_REMOTE_ENV and setenv()s each (overwriting).
 * Returns 0, or -1 when KS_REMOTE_ENV is unset, unreadable or lacks a key (message on stderr).
 */
int ks_test_remote_env_load(void);
/* The value of a loaded key (getenv), or "" when unset; never NULL. */
const char *ks_test_remote(const char *key);
/* Creates bucket `name` in moto (directly, not through the proxy). Returns 0 or -1. */
int ks_test_remote_bucket(const char *name);
/* Adds fault rules (a JSON list, see tests/remote/faultproxy.py) to the proxy. Returns 0 or -1. */
int ks_test_remote_faults(const char *json);
/* Removes every fault rule. Returns 0 or -1. */
int ks_test_remote_faults_clear(void);
/* The proxy's request log (a JSON list) as a malloc'd string, or NULL. */
char *ks_test_remote_log(void);
/* Empties the proxy's request log. Returns 0 or -1. */
int ks_test_remote_log_clear(void);

#endif

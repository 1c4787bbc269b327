# Shell helpers for tests that use the remote test servers (ctest fixture remote_servers).
#   . tests/remote/remote_env.sh     exports every KEY=VALUE of $KS_REMOTE_ENV (servers.env)
#   ks_s3 METHOD BUCKET/KEY [curl args...]   a signed S3 request to moto (prints the body)
#   ks_s3_proxy METHOD BUCKET/KEY [...]      the same through the fault proxy
#   ks_make_bucket NAME                      creates a bucket
#   ks_faults 'JSON list of rules'           adds fault rules to the proxy (see faultproxy.py)
#   ks_faults_clear; ks_proxy_log; ks_proxy_log_clear
if [ -z "${KS_REMOTE_ENV:-}" ] || [ ! -r "$KS_REMOTE_ENV" ]; then
  echo "remote_env.sh: KS_REMOTE_ENV is not set or unreadable: run through ctest (fixture remote_servers)" >&2
  return 1 2>/dev/null || exit 1
fi
while IFS='=' read -r _ks_k _ks_v; do
  case "$_ks_k" in ''|'#'*) continue ;; esac
  export "$_ks_k=$_ks_v"
done < "$KS_REMOTE_ENV"
unset _ks_k _ks_v

_ks_s3_at() {
  local base=$1 method=$2 key=$3; shift 3
  curl -sS --fail-with-body --aws-sigv4 "aws:amz:${AWS_REGION}:s3" \
    --user "${AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY}" \
    -H 'Content-Type: application/octet-stream' -X "$method" "$@" "$base/$key"
}
ks_s3() { _ks_s3_at "$KS_TEST_S3_ENDPOINT" "$@"; }
ks_s3_proxy() { _ks_s3_at "$KS_TEST_PROXY_S3" "$@"; }
ks_make_bucket() { ks_s3 PUT "$1" >/dev/null; }
ks_faults() { curl -sS --fail-with-body -X POST -H 'Content-Type: application/json' --data-binary "$1" "$KS_TEST_PROXY_CTL/faults" >/dev/null; }
ks_faults_clear() { curl -sS --fail-with-body -X DELETE "$KS_TEST_PROXY_CTL/faults" >/dev/null; }
ks_proxy_log() { curl -sS --fail-with-body "$KS_TEST_PROXY_CTL/log"; }
ks_proxy_log_clear() { curl -sS --fail-with-body -X DELETE "$KS_TEST_PROXY_CTL/log" >/dev/null; }

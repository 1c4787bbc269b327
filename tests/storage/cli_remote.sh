#!/bin/sh
# The CLI and the demo on storage URLs, against the test servers (fixture remote_servers):
#   keepsake-digits --run-dir s3://bucket/run, killed (SIGKILL) mid-run with no local state at all,
#   autoresumes from S3 to a final checkpoint identical to an uninterrupted run's;
#   keepsake verify / inspect / diff / convert on s3:// and http:// URLs, `latest` (a pointer) included.
# usage: cli_remote.sh KEEPSAKE_CLI KEEPSAKE_DIGITS REMOTE_ENV_SH
set -u
CLI=$1
BIN=$2
. "$3" || exit 1
export AWS_ENDPOINT_URL="$KS_TEST_S3_ENDPOINT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1 # the demo is given no local directory: nothing may land here
fail=0
die_case() { echo "FAIL: $*"; fail=1; }
expect() { # expect EXIT_CODE PATTERN -- command...: runs it, checks the code and that the output matches
  want=$1 pat=$2
  shift 3
  "$@" >"$WORK/out" 2>&1
  got=$?
  [ "$got" = "$want" ] || die_case "$* exited $got, expected $want: $(cat "$WORK/out")"
  grep -q -- "$pat" "$WORK/out" || die_case "$*: output lacks '$pat': $(cat "$WORK/out")"
}

B=ks-cli
ks_make_bucket $B || exit 1
COMMON="--epochs 3 --save-interval 20ba --keep 3 --seed 7"

# An uninterrupted run, and a run killed at batch 75 then resumed from S3 alone.
"$BIN" --run-dir s3://$B/ref $COMMON >"$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; exit 1; }
KS_TEST_SIGNAL_AT=75:9 "$BIN" --run-dir s3://$B/killed $COMMON --autoresume >"$WORK/k1.log" 2>&1
[ $? -eq 137 ] || die_case "the killed run did not die of SIGKILL: $(tail -3 "$WORK/k1.log")"
[ -z "$(ls -A "$WORK" | grep -v '^k1.log$\|^ref.log$\|^out$')" ] || die_case "local files appeared: $(ls -A "$WORK")"
"$BIN" --run-dir s3://$B/killed $COMMON --autoresume >"$WORK/k2.log" 2>&1 || die_case "resume failed: $(tail -3 "$WORK/k2.log")"
grep -q "resumed from killed/ep1-ba60.keepsake" "$WORK/k2.log" || die_case "did not resume from batch 60: $(head -3 "$WORK/k2.log")"
expect 0 identical -- "$CLI" diff s3://$B/ref/final.keepsake s3://$B/killed/final.keepsake --ignore '*_wct'

# keep 3 deleted the older remote copies; latest names the newest checkpoint
ks_s3 GET "$B?list-type=2&prefix=ref/" >"$WORK/list" || die_case "listing failed"
n=$(grep -o '<Key>ref/ep[^<]*</Key>' "$WORK/list" | wc -l)
[ "$n" = 3 ] || die_case "expected 3 checkpoints under ref/, found $n: $(cat "$WORK/list")"
newest=$(grep -o '<Key>ref/ep[^<]*</Key>' "$WORK/list" | sed 's/.*-ba\([0-9]*\).*/\1 &/' | sort -n | tail -1 |
  sed 's/.*<Key>ref\/\(.*\)<\/Key>/\1/')
latest=$(ks_s3 GET "$B/ref/latest")
[ -n "$latest" ] && [ "$latest" = "$newest" ] || die_case "ref/latest is '$latest', the newest checkpoint '$newest'"

# verify, inspect, diff over S3 and HTTP
expect 0 "OK (keepsake format" -- "$CLI" verify "s3://$B/ref/$latest"
expect 1 "HTTP 404" -- "$CLI" verify "s3://$B/ref/no-such.keepsake"
# latest is a pointer object: verify, inspect and diff follow it as a local `latest` symlink is followed
expect 0 "OK (keepsake format" -- "$CLI" verify "s3://$B/ref/latest"
expect 0 "tensors" -- "$CLI" inspect "s3://$B/ref/latest"
expect 0 "identical" -- "$CLI" diff "s3://$B/ref/latest" "s3://$B/ref/$latest"
ks_s3 GET "$B/ref/$latest" -o "$KS_TEST_HTTP_ROOT/cli.keepsake" || die_case "download failed"
expect 0 "tensors" -- "$CLI" inspect "$KS_TEST_HTTP_URL/cli.keepsake"
expect 0 "identical" -- "$CLI" diff "$KS_TEST_HTTP_URL/cli.keepsake" "s3://$B/ref/$latest"
expect 0 "OK (keepsake format" -- "$CLI" verify "$KS_TEST_HTTP_URL/cli.keepsake"
# a damaged copy (one byte flipped near the end) is BAD over both transports
python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[-5]^=0xff; open(sys.argv[2],'wb').write(b)" \
  "$KS_TEST_HTTP_ROOT/cli.keepsake" "$KS_TEST_HTTP_ROOT/bad.keepsake"
expect 1 "BAD" -- "$CLI" verify "$KS_TEST_HTTP_URL/bad.keepsake"
ks_s3 PUT "$B/bad.keepsake" --data-binary "@$KS_TEST_HTTP_ROOT/bad.keepsake" >/dev/null || die_case "upload failed"
expect 1 "checksum" -- "$CLI" verify "s3://$B/bad.keepsake"
# convert: S3 to S3 (keepsake), HTTP to a local .pt, and a read-only output refused
expect 0 "entries" -- "$CLI" convert "s3://$B/ref/$latest" "s3://$B/converted/copy.keepsake"
expect 0 "OK (keepsake format" -- "$CLI" verify "s3://$B/converted/copy.keepsake"
expect 0 "entries" -- "$CLI" convert "$KS_TEST_HTTP_URL/cli.keepsake" "$WORK/cli.pt"
expect 1 "Read-only" -- "$CLI" convert "s3://$B/ref/$latest" "$KS_TEST_HTTP_URL/new.keepsake"
expect 1 "s3://" -- "$CLI" verify "s3://x/y"
[ $fail = 0 ] && echo "cli_remote: all checks passed"
exit $fail

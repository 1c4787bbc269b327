#!/bin/sh
# Usage: remote_save_errors.sh DIGITS_BIN KEEPSAKE_CLI WORKDIR     (KS_REMOTE_ENV: fixture remote_servers)
# The demo against S3 through the fault proxy:
#   1. faults the retries outlast, on uploads and then on the downloads of an autoresume (503s,
#      dropped connections, truncated bodies): the run ends as an uninterrupted one does;
#   2. an upload that fails for good (503 past every retry), --on-save-error continue: a clear
#      error, training goes on, later saves upload, and the final checkpoint is still right;
#   3. the same with --on-save-error stop: the run stops with status 1, the local checkpoint is
#      saved, and S3 has neither the object nor a `latest` naming it.
set -u
BIN=$1
CLI=$2
WORK=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/remote_env.sh" || exit 1
export AWS_ENDPOINT_URL="$KS_TEST_PROXY_S3"
BUCKET="saveerr-$(date +%s)-$$"
COMMON="--epochs 2 --save-interval 20ba --keep 2 --seed 5"
rm -rf "$WORK"
mkdir -p "$WORK"
ks_make_bucket "$BUCKET" || { echo "save-errors: cannot create bucket $BUCKET"; exit 1; }
ks_faults_clear
fails=0
say() { echo "save-errors: $*"; }
die_case() { say "FAIL: $*"; fails=$((fails + 1)); }
same_as_ref() {
  "$CLI" diff "$WORK/ref/final.keepsake" "$1" --ignore '*_wct' >"$WORK/diff.out" 2>&1 || {
    die_case "$2: final checkpoint differs from the uninterrupted run"; cat "$WORK/diff.out"; }
}
remote_keys() { ks_s3 GET "$BUCKET?list-type=2&prefix=$1/" | grep -o '<Key>[^<]*</Key>' | sed 's/<[^>]*>//g'; }
PUT_CKPT='"target":"s3","method":"PUT","path_re":"/ep[0-9]+-ba[0-9]+\\.keepsake$"'
GET_CKPT='"target":"s3","method":"GET","path_re":"/ep[0-9]+-ba[0-9]+\\.keepsake$"'

"$BIN" --run-dir "$WORK/ref" $COMMON >"$WORK/ref.log" 2>&1 || { say "reference run failed"; cat "$WORK/ref.log"; exit 1; }

# 1. Retried faults: on the uploads of a run halted after batch 50, then on the autoresume's reads.
ks_faults "[{$PUT_CKPT,\"action\":\"status\",\"status\":503,\"times\":2},
            {$PUT_CKPT,\"action\":\"drop\",\"after_bytes\":3000,\"skip\":1,\"times\":1},
            {\"target\":\"s3\",\"method\":\"PUT\",\"path_re\":\"/latest$\",\"action\":\"status\",\"status\":500,\"times\":1}]"
"$BIN" --run-dir "s3://$BUCKET/retried" $COMMON --halt-after-batches 50 >"$WORK/retried.log" 2>&1
[ $? -eq 137 ] || { die_case "retried: the halted run did not reach batch 50"; cat "$WORK/retried.log"; }
ks_faults_clear
ks_faults "[{$GET_CKPT,\"action\":\"truncate\",\"times\":1},{$GET_CKPT,\"action\":\"drop\",\"times\":1},
            {$GET_CKPT,\"action\":\"status\",\"status\":503,\"times\":2}]"
"$BIN" --run-dir "s3://$BUCKET/retried" $COMMON --autoresume >>"$WORK/retried.log" 2>&1 ||
  { die_case "retried: resume failed"; cat "$WORK/retried.log"; }
grep -q "resumed from retried/ep0-ba40.keepsake" "$WORK/retried.log" || { die_case "retried: did not resume from ep0-ba40"; cat "$WORK/retried.log"; }
ks_proxy_log | grep -q '"fault": "truncate/response"' || die_case "retried: the truncate fault never applied"
ks_faults_clear
same_as_ref "s3://$BUCKET/retried/final.keepsake" retried
grep -q "warning" "$WORK/retried.log" && { die_case "retried: a retried fault surfaced as a warning"; cat "$WORK/retried.log"; }
[ $fails -eq 0 ] && say "ok: retried faults on upload and download are invisible"

# 2. The first upload fails past every retry (1 + 5 attempts); --on-save-error continue.
ks_faults "[{$PUT_CKPT,\"action\":\"status\",\"status\":503,\"times\":6}]"
"$BIN" --run-dir "$WORK/cont" --upload-to "s3://$BUCKET/cont" $COMMON --on-save-error continue >"$WORK/cont.log" 2>&1 ||
  { die_case "continue: the run did not go on"; cat "$WORK/cont.log"; }
ks_faults_clear
grep -q "saving a checkpoint (training goes on" "$WORK/cont.log" || die_case "continue: no error message for the failed upload"
grep -q "upload of .*ep0-ba20.keepsake.*failed" "$WORK/cont.log" || die_case "continue: the message does not name the upload"
grep -q "storage: PUT .*ep0-ba20.keepsake: HTTP 503" "$WORK/cont.log" || die_case "continue: no HTTP 503 detail"
remote_keys cont | grep -q "ep0-ba20.keepsake" && die_case "continue: S3 has the object whose upload failed"
[ "$(ks_s3 GET "$BUCKET/cont/latest" | grep -o 'ep[0-9]*-ba[0-9]*\.keepsake')" = ep1-ba80.keepsake ] ||
  die_case "continue: S3 latest does not name the last checkpoint"
same_as_ref "$WORK/cont/final.keepsake" continue
[ $fails -eq 0 ] && say "ok: a persistent upload failure with --on-save-error continue"

# 3. The same with --on-save-error stop.
ks_faults "[{$PUT_CKPT,\"action\":\"status\",\"status\":503,\"times\":6}]"
"$BIN" --run-dir "$WORK/stop" --upload-to "s3://$BUCKET/stop" $COMMON --on-save-error stop >"$WORK/stop.log" 2>&1
rc=$?
ks_faults_clear
[ $rc -eq 1 ] || { die_case "stop: expected exit status 1, got $rc"; cat "$WORK/stop.log"; }
grep -q "keepsake-digits: saving a checkpoint: .*upload of" "$WORK/stop.log" || die_case "stop: no clear error"
[ -f "$WORK/stop/ep0-ba20.keepsake" ] || die_case "stop: the local checkpoint is missing"
[ -z "$(remote_keys stop)" ] || die_case "stop: S3 has objects: $(remote_keys stop)"
"$BIN" --run-dir "$WORK/stop" --upload-to "s3://$BUCKET/stop" $COMMON --autoresume >>"$WORK/stop.log" 2>&1 ||
  die_case "stop: the resumed run failed"
same_as_ref "$WORK/stop/final.keepsake" stop
[ $fails -eq 0 ] && say "ok: a persistent upload failure with --on-save-error stop"

[ $fails -eq 0 ] && say "all fault cases behaved" || say "$fails failure(s)"
exit $fails

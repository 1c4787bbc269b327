#!/bin/sh
# Usage: remote_resume.sh DIGITS_BIN KEEPSAKE_CLI WORKDIR     (KS_REMOTE_ENV: fixture remote_servers)
# Remote resume: the demo saves to S3 (moto), straight (--run-dir s3://...) or locally then
# uploaded (--upload-to s3://...). It is killed mid-run, everything local to the "machine" is
# deleted (its run directory, its --cache-dir of what it read from S3, working directory and
# TMPDIR), and --autoresume continues from S3.
# The final checkpoint must equal an uninterrupted local run's, per keepsake diff --ignore '*_wct'.
# Then the newest remote checkpoint is truncated, or a byte of it flipped: autoresume skips it and
# continues from the previous one, to the same final checkpoint. Last, background saves killed
# while an upload may be in flight.
set -u
BIN=$1
CLI=$2
WORK=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/remote_env.sh" || exit 1
export AWS_ENDPOINT_URL="$KS_TEST_S3_ENDPOINT"
BUCKET="resume-$(date +%s)-$$"
EPOCHS=3 # 45 batches per epoch: 135 batches, checkpoints every 20
COMMON="--epochs $EPOCHS --save-interval 20ba --keep 2 --seed 77"
rm -rf "$WORK"
mkdir -p "$WORK"
ks_make_bucket "$BUCKET" || { echo "remote-resume: cannot create bucket $BUCKET"; exit 1; }
fails=0
say() { echo "remote-resume: $*"; }
die_case() { say "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" --run-dir "$WORK/ref" $COMMON >"$WORK/ref.log" 2>&1 || { say "reference run failed"; cat "$WORK/ref.log"; exit 1; }

# machine NAME: a fresh "machine" (working directory and TMPDIR) for a case.
machine() { mkdir -p "$WORK/m-$1/tmp"; }
# wipe NAME: the machine is gone, with whatever it had locally.
wipe() { rm -rf "$WORK/m-$1"; }
# run NAME ARGS...: the demo on machine NAME (appending to its log); returns its exit status.
run() {
  name=$1; shift
  machine "$name"
  (cd "$WORK/m-$name" && TMPDIR="$WORK/m-$name/tmp" "$BIN" "$@" $COMMON) >>"$WORK/$name.log" 2>&1
}
# args NAME MODE: where case NAME saves in MODE (direct: S3 only; upload: local run dir + S3).
args() {
  if [ "$2" = direct ]; then echo "--run-dir s3://$BUCKET/$1 --cache-dir $WORK/m-$1/cache"
  else echo "--run-dir $WORK/m-$1/run --upload-to s3://$BUCKET/$1 --cache-dir $WORK/m-$1/cache"; fi
}
# final NAME MODE: where its final checkpoint is.
final() { if [ "$2" = direct ]; then echo "s3://$BUCKET/$1/final.keepsake"; else echo "$WORK/m-$1/run/final.keepsake"; fi; }
compare() {
  if "$CLI" diff "$WORK/ref/final.keepsake" "$(final "$1" "$2")" --ignore '*_wct' >"$WORK/$1.diff" 2>&1; then
    say "ok: $1"
  else
    die_case "$1: final checkpoint differs from the uninterrupted run"
    cat "$WORK/$1.diff" "$WORK/$1.log"
  fi
}
resume() {
  run "$1" $(args "$1" "$2") --autoresume || { die_case "$1: resume failed"; cat "$WORK/$1.log"; return 1; }
  grep -q "resumed from" "$WORK/$1.log" || { die_case "$1: did not resume from S3"; cat "$WORK/$1.log"; return 1; }
}
# The newest checkpoint in S3 (what `latest` names).
remote_latest() { ks_s3 GET "$BUCKET/$1/latest" 2>/dev/null | sed -n 's/.*\(ep[0-9]*-ba[0-9]*\.keepsake\).*/\1/p' | head -1; }

for mode in direct upload; do
  # 1. Killed (exit 137, no cleanup) right after batch 61, mid-epoch, after three saves.
  name="$mode-halt"
  run "$name" $(args "$name" $mode) --halt-after-batches 61
  [ $? -eq 137 ] || die_case "$name: expected exit status 137"
  [ "$(remote_latest "$name")" = ep1-ba60.keepsake ] || die_case "$name: S3 latest is '$(remote_latest "$name")', expected ep1-ba60.keepsake"
  wipe "$name"
  resume "$name" $mode && compare "$name" $mode
  grep -q "resumed from .*ep1-ba60.keepsake" "$WORK/$name.log" || die_case "$name: did not resume from ep1-ba60"
  # The resumed run read the checkpoint from S3 through its (new, empty) cache: the pieces are there.
  [ -n "$(find "$WORK/m-$name/cache" -type f 2>/dev/null | head -1)" ] || die_case "$name: nothing in --cache-dir"

  # 2. SIGKILL from outside, wherever the run is (once S3 has a checkpoint).
  name="$mode-sigkill"
  machine "$name"
  (cd "$WORK/m-$name" && TMPDIR="$WORK/m-$name/tmp" exec "$BIN" $(args "$name" $mode) $COMMON) >"$WORK/$name.log" 2>&1 &
  pid=$!
  i=0
  while [ -z "$(remote_latest "$name")" ] && [ $i -lt 200 ] && kill -0 $pid 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  wipe "$name"
  resume "$name" $mode && compare "$name" $mode

  # 3. The newest remote checkpoint damaged: truncated to half, or one byte flipped near its end.
  for damage in truncate flip; do
    name="$mode-$damage"
    run "$name" $(args "$name" $mode) --halt-after-batches 100
    newest=$(remote_latest "$name")
    [ "$newest" = ep2-ba100.keepsake ] || die_case "$name: S3 latest is '$newest', expected ep2-ba100.keepsake"
    ks_s3 GET "$BUCKET/$name/$newest" -o "$WORK/$name.obj" || die_case "$name: cannot fetch $newest"
    size=$(wc -c <"$WORK/$name.obj")
    if [ $damage = truncate ]; then
      head -c $((size / 2)) "$WORK/$name.obj" >"$WORK/$name.bad"
    else
      cp "$WORK/$name.obj" "$WORK/$name.bad"
      printf '\377' | dd of="$WORK/$name.bad" bs=1 seek=$((size - 10)) conv=notrunc 2>/dev/null
    fi
    ks_s3 PUT "$BUCKET/$name/$newest" --data-binary @"$WORK/$name.bad" >/dev/null || die_case "$name: cannot damage $newest"
    wipe "$name"
    resume "$name" $mode && compare "$name" $mode
    grep -q "warning: skipping checkpoint.*$newest" "$WORK/$name.log" || die_case "$name: no warning about the damaged $newest"
    grep -q "resumed from .*ep1-ba80.keepsake" "$WORK/$name.log" || die_case "$name: did not fall back to ep1-ba80"
  done
done

# 4. Background saves (--async-save): the upload runs on the saver's thread; killed right after
#    batch 61, while the save of batch 60 may still be uploading.
name=upload-async
run "$name" $(args "$name" upload) --async-save --halt-after-batches 61
[ $? -eq 137 ] || die_case "$name: expected exit status 137"
wipe "$name"
run "$name" $(args "$name" upload) --async-save --autoresume || { die_case "$name: resume failed"; cat "$WORK/$name.log"; }
grep -q "resumed from .*ep[01]-ba[0-9]*.keepsake" "$WORK/$name.log" || die_case "$name: did not resume from S3"
compare "$name" upload

[ $fails -eq 0 ] && say "every run resumed from S3 to the uninterrupted run's final checkpoint" || say "$fails failure(s)"
exit $fails

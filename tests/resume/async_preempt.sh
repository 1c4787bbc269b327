#!/bin/sh
# Usage: async_preempt.sh DIGITS_BIN KEEPSAKE_CLI WORKDIR
# Background saves, preemption and early stopping, each interrupted and autoresumed: every final
# checkpoint must equal an uninterrupted synchronous run's, except for the *_wct fields.
set -u
BIN=$1
CLI=$2
WORK=$3
COMMON="--epochs 4 --save-interval 20ba --keep 2 --seed 77" # 45 batches per epoch, 180 in all
rm -rf "$WORK"
mkdir -p "$WORK"
fails=0
say() { echo "async-test: $*"; }
die_case() { say "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" --run-dir "$WORK/ref" $COMMON >"$WORK/ref.log" 2>&1 || { say "reference run failed"; cat "$WORK/ref.log"; exit 1; }

# same NAME REF: the final checkpoint of run NAME equals REF's.
same() {
  if "$CLI" diff "$WORK/$2/final.keepsake" "$WORK/$1/final.keepsake" --ignore '*_wct' >"$WORK/$1.diff" 2>&1; then
    say "ok: $1"
  else
    die_case "$1: final checkpoint differs from $2"
    cat "$WORK/$1.diff"
  fi
}
# resume NAME [FLAGS]: autoresume run NAME to the end (with the flags it was started with).
resume() {
  name=$1
  shift
  "$BIN" --run-dir "$WORK/$name" $COMMON --autoresume "$@" >>"$WORK/$name.log" 2>&1 || { die_case "$name: resume failed"; cat "$WORK/$name.log"; }
}
no_temp() { ls -a "$WORK/$1" | grep -q '\.tmp' && die_case "$1: a temp file was left behind"; }

# 1. An uninterrupted run with background saves equals the synchronous one, and so does every
#    checkpoint it kept.
"$BIN" --run-dir "$WORK/async" $COMMON --async-save >"$WORK/async.log" 2>&1 || die_case "async run failed"
same async ref
for f in ep3-ba160.keepsake ep3-ba180.keepsake; do
  "$CLI" diff "$WORK/ref/$f" "$WORK/async/$f" --ignore '*_wct' >/dev/null 2>&1 || die_case "async: $f differs from the synchronous run's"
done
no_temp async

# 2. Halted while a background save is in flight (every write of a save sleeps 30 ms, and the run
#    halts right after starting the save of batch 40 or 120), or between saves.
for b in 40 61 120 135; do
  KS_TEST_SAVE_DELAY_MS=30 "$BIN" --run-dir "$WORK/halt$b" $COMMON --async-save --halt-after-batches "$b" >"$WORK/halt$b.log" 2>&1
  [ $? -eq 137 ] || die_case "halt$b: expected exit status 137"
  resume "halt$b" --async-save
  same "halt$b" ref
  no_temp "halt$b"
done
grep -q "resumed from .*ep0-ba20" "$WORK/halt40.log" || die_case "halt40: the save in flight at the halt should not count; expected a resume from batch 20"

# 3. SIGKILL inside the background write of the 3rd save (after 5000 bytes).
KS_TEST_KILL_IN_SAVE=3:5000 "$BIN" --run-dir "$WORK/bgkill" $COMMON --async-save >"$WORK/bgkill.log" 2>&1
[ $? -eq 137 ] || die_case "bgkill: expected death by SIGKILL (137)"
resume bgkill --async-save
same bgkill ref
no_temp bgkill

# 4. Preemption: SIGTERM (and SIGUSR1) mid-epoch saves at the next batch boundary and exits 75;
#    autoresume continues exactly from there.
for sig in 15:term 10:usr1; do
  num=${sig%%:*}
  name=preempt_${sig##*:}
  KS_TEST_SIGNAL_AT=67:$num "$BIN" --run-dir "$WORK/$name" $COMMON --async-save >"$WORK/$name.log" 2>&1
  rc=$?
  [ $rc -eq 75 ] || die_case "$name: expected exit status 75 after preemption, got $rc"
  grep -q "preempted by signal $num after batch 67" "$WORK/$name.log" || die_case "$name: no preemption message"
  [ "$(readlink "$WORK/$name/latest")" = "ep1-ba67.keepsake" ] || die_case "$name: latest is not the preemption checkpoint"
  resume "$name" --async-save
  grep -q "resumed from .*ep1-ba67.keepsake" "$WORK/$name.log" || die_case "$name: did not resume from the preemption checkpoint"
  same "$name" ref
done

# 5. Early stopping (patience 2 fires after epoch 5 of 12), resumed mid-patience: halted in epoch 5
#    (resumes from batch 200, saved with one epoch of waiting) or late in epoch 4.
ES="--epochs 12 --save-interval 20ba --keep 2 --seed 77 --early-stop eval/MulticlassAccuracy:2"
"$BIN" --run-dir "$WORK/es_ref" $ES >"$WORK/es_ref.log" 2>&1 || die_case "early-stop reference failed"
grep -q "early stopping after epoch 5" "$WORK/es_ref.log" || die_case "es_ref: expected early stopping after epoch 5"
for b in 170 215; do
  "$BIN" --run-dir "$WORK/es$b" $ES --halt-after-batches $b >"$WORK/es$b.log" 2>&1
  "$BIN" --run-dir "$WORK/es$b" $ES --autoresume >>"$WORK/es$b.log" 2>&1 || die_case "es$b: resume failed"
  grep -q "early stopping after epoch 5" "$WORK/es$b.log" || die_case "es$b: did not stop after epoch 5"
  same "es$b" es_ref
done

# 6. A full disk at the 3rd save: by default the run stops, naming the file and the cause, with the
#    checkpoints already committed intact; with --on-save-error continue it trains on, the next save
#    retries, and the run ends identical to the reference.
for mode in sync async; do
  flag=$([ $mode = async ] && echo --async-save)
  KS_TEST_FAIL_SAVE=3 "$BIN" --run-dir "$WORK/full_$mode" $COMMON $flag >"$WORK/full_$mode.log" 2>&1
  [ $? -eq 1 ] || die_case "full_$mode: expected exit status 1 on a failed save"
  grep -q "ep1-ba60.keepsake.*No space left" "$WORK/full_$mode.log" || die_case "full_$mode: the error names neither the file nor the cause"
  "$CLI" verify "$WORK/full_$mode/ep0-ba40.keepsake" >/dev/null 2>&1 || die_case "full_$mode: the last good checkpoint is damaged"
  no_temp "full_$mode"
  KS_TEST_FAIL_SAVE=3 "$BIN" --run-dir "$WORK/cont_$mode" $COMMON $flag --on-save-error continue >"$WORK/cont_$mode.log" 2>&1 ||
    die_case "cont_$mode: the run did not go on after the failed save"
  grep -q "training goes on" "$WORK/cont_$mode.log" || die_case "cont_$mode: no warning about the failed save"
  same "cont_$mode" ref
  no_temp "cont_$mode"
done

[ $fails -eq 0 ] && say "all async, preemption and early-stopping cases resumed bit-identically" || say "$fails failure(s)"
exit $fails

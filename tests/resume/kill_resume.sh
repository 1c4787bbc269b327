#!/bin/sh
# Usage: kill_resume.sh DIGITS_BIN KEEPSAKE_CLI WORKDIR
# A reference run, then runs killed at several points and autoresumed; each final
# checkpoint must equal the reference's except for the *_wct fields.
set -u
BIN=$1
CLI=$2
WORK=$3
EPOCHS=4 # 45 batches per epoch: 180 batches, checkpoints every 20
COMMON="--epochs $EPOCHS --save-interval 20ba --keep 2 --seed 77"
rm -rf "$WORK"
mkdir -p "$WORK"
fails=0

say() { echo "resume-test: $*"; }
die_case() { say "FAIL: $*"; fails=$((fails + 1)); }

"$BIN" --run-dir "$WORK/ref" $COMMON >"$WORK/ref.log" 2>&1 || { say "reference run failed"; cat "$WORK/ref.log"; exit 1; }

# finish NAME: autoresume to the end, then compare with the reference.
finish() {
  "$BIN" --run-dir "$WORK/$1" $COMMON --autoresume >>"$WORK/$1.log" 2>&1 || { die_case "$1: resume failed"; cat "$WORK/$1.log"; return; }
  if "$CLI" diff "$WORK/ref/final.keepsake" "$WORK/$1/final.keepsake" --ignore '*_wct' >"$WORK/$1.diff" 2>&1; then
    say "ok: $1"
  else
    die_case "$1: final checkpoint differs from the reference"
    cat "$WORK/$1.diff"
  fi
}

# 1. Halt (_exit) right after a batch: before any save, right after a save, mid-epoch, at an epoch end.
for b in 7 20 61 90 135; do
  "$BIN" --run-dir "$WORK/halt$b" $COMMON --halt-after-batches "$b" >"$WORK/halt$b.log" 2>&1
  [ $? -eq 137 ] || die_case "halt$b: expected exit status 137"
  finish "halt$b"
done

# 2. SIGKILL inside a save, after N bytes of the temp file (header only / mid-data / all but the end).
for spec in 2:100 3:5000 4:40000; do
  name="insave$(echo "$spec" | tr ':' '_')"
  KS_TEST_KILL_IN_SAVE=$spec "$BIN" --run-dir "$WORK/$name" $COMMON >"$WORK/$name.log" 2>&1
  rc=$?
  [ $rc -eq 137 ] || die_case "$name: expected death by SIGKILL (137), got $rc"
  ls -a "$WORK/$name" | grep -q '\.tmp' || die_case "$name: expected a leftover temp file from the killed save"
  finish "$name"
  ls -a "$WORK/$name" | grep -q '\.tmp' && die_case "$name: autoresume left the temp file behind"
done

# 3. Two kills in a row, the second inside the first save after resuming.
"$BIN" --run-dir "$WORK/twice" $COMMON --halt-after-batches 50 >"$WORK/twice.log" 2>&1
KS_TEST_KILL_IN_SAVE=1:3000 "$BIN" --run-dir "$WORK/twice" $COMMON --autoresume >>"$WORK/twice.log" 2>&1
finish twice

# 4. SIGKILL from outside at whatever point the run has reached.
"$BIN" --run-dir "$WORK/sigkill" $COMMON >"$WORK/sigkill.log" 2>&1 &
pid=$!
sleep 0.15
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
finish sigkill

# 5. The newest checkpoint truncated, or with a flipped byte: autoresume warns and uses the previous one.
for damage in truncate flip; do
  d="$WORK/$damage"
  "$BIN" --run-dir "$d" $COMMON --halt-after-batches 100 >"$d.log" 2>&1
  newest="$d/$(readlink "$d/latest")"
  size=$(wc -c <"$newest")
  if [ "$damage" = truncate ]; then
    head -c $((size / 2)) "$newest" >"$newest.part" && mv "$newest.part" "$newest"
  else
    printf '\377' | dd of="$newest" bs=1 seek=$((size - 10)) conv=notrunc 2>/dev/null
  fi
  finish "$damage"
  grep -q "warning: skipping checkpoint" "$d.log" || die_case "$damage: no warning about the damaged checkpoint"
  grep -q "resumed from .*ep1-ba80" "$d.log" || die_case "$damage: did not fall back to the previous checkpoint"
done

[ $fails -eq 0 ] && say "all kill points resumed bit-identically" || say "$fails failure(s)"
exit $fails

#!/bin/sh
# keepsake-digits under mpirun -np 2 (data parallel, sharded checkpoint directories):
# killed at several points (one rank or both; after a batch, or inside a save) and
# autoresumed, every run ends with a final checkpoint identical to an uninterrupted
# 2-rank run's (`keepsake diff DIR DIR --ignore '*_wct'`). Also: retention keeps 2
# directories, `latest` names the newest, and the directory of a killed save (no
# index) is removed by the resume.
# The synced eval accuracy printed equals MulticlassAccuracy recomputed from the union of the
# per-rank local states saved in the final checkpoint, and every rank's stored `_computed`.
# MODE sync runs the checks above; MODE async the same kills with --async-save (background writes,
# the commit deferred to the next save).
# usage: demo_mpi.sh MPIEXEC DIGITS KEEPSAKE_CLI WORKDIR MERGED_METRIC sync|async
set -u
# odls_base_sigkill_timeout 0: a job whose rank died is torn down at once, not after a grace second.
MPI="$1 --oversubscribe --allow-run-as-root --mca odls_base_sigkill_timeout 0 -np 2"
BIN=$2 CLI=$3 WORK=$4 MERGED=$5 MODE=$6
COMMON="--epochs 2 --save-interval 20ba --keep 2 --seed 77" # 45 batches per epoch; saves at 20, 40, 60, 80
rm -rf "$WORK"
mkdir -p "$WORK"
fails=0
say() { echo "demo-mpi: $*"; }
bad() { say "FAIL: $*"; fails=$((fails + 1)); }

$MPI "$BIN" --run-dir "$WORK/ref" $COMMON >"$WORK/ref.log" 2>&1 || { say "reference run failed"; cat "$WORK/ref.log"; exit 1; }
[ "$(readlink "$WORK/ref/latest")" = ep1-ba80 ] || bad "ref: latest is '$(readlink "$WORK/ref/latest")', expected ep1-ba80"
kept=$(cd "$WORK/ref" && ls -d ep*-ba* | tr '\n' ' ')
[ "$kept" = "ep1-ba60 ep1-ba80 " ] || bad "ref: retention kept '$kept', expected the 2 newest"
[ -f "$WORK/ref/final/model.safetensors.index.json" ] || bad "ref: no final sharded checkpoint"
printed=$(sed -n 's/^final eval accuracy \([0-9.]*\) .*/\1/p' "$WORK/ref.log")
merged=$("$MERGED" "$WORK/ref/final") || bad "ref: a rank's stored eval accuracy is not the synced one"
[ -n "$printed" ] && [ "$printed" = "$merged" ] || bad "ref: printed eval accuracy '$printed', from the merged states '$merged'"
[ "$(grep -c '^epoch ' "$WORK/ref.log")" -eq 2 ] || bad "ref: expected one epoch line per epoch (rank 0 alone prints)"

# keepsake diff on directories: two checkpoints of the run differ, rank by rank where per-rank.
"$CLI" diff "$WORK/ref/ep1-ba60" "$WORK/ref/ep1-ba80" >"$WORK/dirdiff.txt" 2>&1
[ $? -eq 1 ] || bad "diff DIR DIR: expected exit 1 for two different checkpoints"
grep -q '^~ \[rank 1\] state/dataset_state/' "$WORK/dirdiff.txt" || bad "diff DIR DIR: rank 1's data position not compared"
grep -q '^~ state/model/fc1.weight' "$WORK/dirdiff.txt" || bad "diff DIR DIR: the replicated model not compared"

# finish NAME [FLAG]: autoresume to the end, then compare with the reference.
finish() {
  $MPI "$BIN" --run-dir "$WORK/$1" $COMMON ${2:-} --autoresume >>"$WORK/$1.log" 2>&1 || { bad "$1: resume failed"; cat "$WORK/$1.log"; return; }
  if "$CLI" diff "$WORK/ref/final" "$WORK/$1/final" --ignore '*_wct' >"$WORK/$1.diff" 2>&1; then
    say "ok: $1"
  else
    bad "$1: final checkpoint differs from the reference"
    cat "$WORK/$1.diff"
  fi
}

if [ "$MODE" = sync ]; then
# 1. After a batch: rank 1 alone, then both ranks.
if KS_TEST_KILL_RANK=1 $MPI "$BIN" --run-dir "$WORK/halt1" $COMMON --halt-after-batches 30 >"$WORK/halt1.log" 2>&1; then
  bad "halt1: the run did not die"
fi
finish halt1
if $MPI "$BIN" --run-dir "$WORK/halt2" $COMMON --halt-after-batches 61 >"$WORK/halt2.log" 2>&1; then bad "halt2: the run did not die"; fi
finish halt2

# 2. Inside a save (SIGKILL after N bytes of the rank's file): rank 1 alone, then both.
for case in "insave1 1 2:3000" "insave2 all 3:20000"; do
  set -- $case
  if [ "$2" = all ]; then
    KS_TEST_KILL_IN_SAVE=$3 $MPI "$BIN" --run-dir "$WORK/$1" $COMMON >"$WORK/$1.log" 2>&1 && bad "$1: the run did not die"
  else
    KS_TEST_KILL_RANK=$2 KS_TEST_KILL_IN_SAVE=$3 $MPI "$BIN" --run-dir "$WORK/$1" $COMMON >"$WORK/$1.log" 2>&1 && bad "$1: the run did not die"
  fi
  dead=$(for d in "$WORK/$1"/ep*-ba*; do [ -f "$d/model.safetensors.index.json" ] || echo "$d"; done)
  [ -n "$dead" ] || bad "$1: expected the killed save's directory without an index"
  finish "$1"
  for d in $dead; do [ -e "$d" ] && [ ! -f "$d/model.safetensors.index.json" ] && bad "$1: the incomplete $d was not removed"; done
  grep -q "resumed from .*ep0-ba" "$WORK/$1.log" || bad "$1: did not resume from the previous complete checkpoint"
done

# 3. Killed twice: both ranks after batch 50, then rank 0 inside the first save after resuming.
$MPI "$BIN" --run-dir "$WORK/twice" $COMMON --halt-after-batches 50 >"$WORK/twice.log" 2>&1
KS_TEST_KILL_RANK=0 KS_TEST_KILL_IN_SAVE=1:3000 $MPI "$BIN" --run-dir "$WORK/twice" $COMMON --autoresume >>"$WORK/twice.log" 2>&1 &&
  bad "twice: the second run did not die"
finish twice

# 4. Preempted: SIGUSR1 reaches rank 1 alone after batch 30; every rank saves ep0-ba30 and exits 75.
KS_TEST_KILL_RANK=1 KS_TEST_SIGNAL_AT=30:10 $MPI "$BIN" --run-dir "$WORK/preempt" $COMMON >"$WORK/preempt.log" 2>&1
rc=$?
[ $rc -eq 75 ] || bad "preempt: expected exit status 75, got $rc"
[ -f "$WORK/preempt/ep0-ba30/model.safetensors.index.json" ] || bad "preempt: no committed ep0-ba30"
finish preempt
fi

# 5. Background saves (--async-save): the files are written by a thread, the commit (index, latest,
# retention) waits for the next save. Uninterrupted, the run ends as the synchronous one; halted
# with a save in flight, that directory has no index and the run resumes from the one before;
# rank 1 killed inside a background write, the same.
if [ "$MODE" = async ]; then
ASYNC="--async-save"
$MPI "$BIN" --run-dir "$WORK/async" $COMMON $ASYNC >"$WORK/async.log" 2>&1 || { bad "async: the run failed"; cat "$WORK/async.log"; }
"$CLI" diff "$WORK/ref/final" "$WORK/async/final" --ignore '*_wct' >"$WORK/async.diff" 2>&1 || { bad "async: final differs"; cat "$WORK/async.diff"; }
[ "$(readlink "$WORK/async/latest")" = ep1-ba80 ] || bad "async: latest is '$(readlink "$WORK/async/latest")'"
kept=$(cd "$WORK/async" && ls -d ep*-ba* | tr '\n' ' ')
[ "$kept" = "ep1-ba60 ep1-ba80 " ] || bad "async: retention kept '$kept'"
$MPI "$BIN" --run-dir "$WORK/asynchalt" $COMMON $ASYNC --halt-after-batches 45 >"$WORK/asynchalt.log" 2>&1 &&
  bad "asynchalt: the run did not die"
[ -d "$WORK/asynchalt/ep0-ba40" ] && [ ! -f "$WORK/asynchalt/ep0-ba40/model.safetensors.index.json" ] ||
  bad "asynchalt: expected ep0-ba40 written but not committed"
finish asynchalt $ASYNC
grep -q "resumed from .*ep0-ba20 " "$WORK/asynchalt.log" || bad "asynchalt: did not resume from ep0-ba20"
KS_TEST_KILL_RANK=1 KS_TEST_KILL_IN_SAVE=3:3000 $MPI "$BIN" --run-dir "$WORK/asynckill" $COMMON $ASYNC >"$WORK/asynckill.log" 2>&1 &&
  bad "asynckill: the run did not die"
finish asynckill $ASYNC
fi

[ $fails -eq 0 ] && say "all kill points resumed to the uninterrupted 2-rank run's final checkpoint" || say "$fails failure(s)"
exit $fails

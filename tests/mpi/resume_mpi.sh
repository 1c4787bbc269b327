#!/bin/sh
# A 2-rank run killed at several points (before a step, and in the middle of a save;
# the last rank alone, then both) and resumed each time from its newest complete
# checkpoint ends with a final checkpoint byte-identical to an uninterrupted run's.
# usage: resume_mpi.sh MPIEXEC PROGRAM SCRATCH
set -u
mpi="$1 --oversubscribe --allow-run-as-root -np 2"
prog=$2 tmp=$3
rm -rf "$tmp"
mkdir -p "$tmp"
$mpi "$prog" "$tmp/straight" 10 || { echo "the uninterrupted run failed"; exit 1; }
for kill in "3 last step" "6 last save" "7 all step" "8 all save"; do
  if $mpi "$prog" "$tmp/killed" 10 --die-at $kill >/dev/null 2>&1; then
    echo "the run killed at '$kill' did not die"
    exit 1
  fi
done
out=$($mpi "$prog" "$tmp/killed" 10) || { echo "the resumed run failed"; exit 1; }
# The last kill hit the save of batch 8: that directory has no index, so the run resumes at 6.
[ "$out" = "resumed at batch 6" ] || { echo "expected to resume at batch 6, got: $out"; exit 1; }
for f in "$tmp"/straight/ep0-ba10/*; do
  cmp "$f" "$tmp/killed/ep0-ba10/$(basename "$f")" || { echo "final checkpoints differ: $(basename "$f")"; exit 1; }
done
left=$(find "$tmp/killed" -name '.*.tmp-*' | wc -l)
[ "$left" -eq 0 ] || { echo "$left temporary files were left behind"; exit 1; }
echo "resume_mpi: killed 4 times, resumed, final checkpoint identical to the uninterrupted run"

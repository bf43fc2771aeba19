#!/usr/bin/env bash
# Runs the whole test suite N times in a row while two CPU hogs compete for the cores, to
# flush out tests that pass only on a quiet machine. Stops at the first red run.
#
#   scripts/stress-tests.sh 10
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
hogs=()
stop_hogs() {
    for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
scripts/test.sh --no-run --quiet
for _ in 1 2; do
    ( while :; do :; done ) &
    hogs+=("$!")
done
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    if ! log=$(scripts/test.sh 2>&1); then
        echo "$log" | grep -E -A4 "panicked at" | head -40
        echo "$log" | grep -E "FAILED" | head -20
        echo "stress run $i of $runs: FAILED"
        exit 1
    fi
    passed=$(echo "$log" | grep -E "^test result: ok" | sed -E 's/.* ok\. ([0-9]+) passed.*/\1/' | awk "{s+=\$1} END {print s}")
    echo "stress run $i of $runs: ok, $passed tests passed in $(( $(date +%s) - start )) s under 2 CPU hogs"
done
echo "$runs passed, 0 failed"

#!/usr/bin/env bash
# Decode speed on a shared machine: `sift bench` (tg64) alone and with a CPU-bound neighbour
# process on one of the cores, for -t 1, -t 2 and -t 2 --poll 0, and llama-bench where built.
# Rounds alternate the settings, so drift of the host hits them alike.
#   bench/threads_neighbor.sh MODEL [ROUNDS] [SIFT_BINARY...]
# Prints one line per run: binary, neighbour (0/1), flags, tok/s. NO_LLAMA=1 skips llama-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
m=$1; rounds=${2:-3}; shift $(( $# >= 2 ? 2 : 1 ))
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(target/release/sift)
tg() { "$@" -o json 2>/dev/null | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[-1]["avg_ts"])'; }
for r in $(seq "$rounds"); do
  for nb in 0 1; do
    pid=""
    if [ "$nb" = 1 ]; then sha256sum /dev/zero & pid=$!; sleep 0.5; fi
    for b in "${bins[@]}"; do
      for flags in "-t 1" "-t 2" "-t 2 --poll 0"; do
        # shellcheck disable=SC2086
        echo "round $r  $b  neighbour=$nb  $flags  $(tg "$b" bench -m "$m" -p 0 -n 64 -r 3 $flags)"
      done
    done
    if [ -z "${NO_LLAMA:-}" ] && [ -x .ref/build/bin/llama-bench ]; then
      for flags in "-t 1" "-t 2" "-t 2 --poll 0"; do
        # shellcheck disable=SC2086
        echo "round $r  llama-bench  neighbour=$nb  $flags  $(LD_LIBRARY_PATH=.ref/build/bin tg .ref/build/bin/llama-bench -m "$m" -p 0 -n 64 -r 3 $flags)"
      done
    fi
    if [ -n "$pid" ]; then kill "$pid"; wait "$pid" 2>/dev/null || true; fi
  done
done

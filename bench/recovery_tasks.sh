#!/usr/bin/env bash
# Task accuracy of one recovery configuration (issue 19): HellaSwag (the first N items of the
# validation set, default 1000) and the full ARC-Easy test, by log-likelihood as lm-eval scores
# them (`sift eval`), through whatever path the flags choose (`--all-columns` for the pack's
# columns, the path that decodes fast).
#
#   bench/recovery_tasks.sh LABEL MODEL [sift eval flags...]
#   N=200 bench/recovery_tasks.sh "dip 0.5" models/X.sift --all-columns --sparsity dip --ratio 0.5
set -euo pipefail
label=$1; model=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
sift=${SIFT:-$here/target/release/sift}
data=${DATA:-$here/../shared/data}
n=${N:-1000}
score() { "$sift" eval -m "$model" -t 2 "$@" 2>&1 | grep -E '^acc = ' | tail -1; }
hs=$(score -f "$data/hellaswag/hellaswag_val_full.txt" --limit "$n" "$@")
arc=$(score -f "$data/mc/arc-easy/test.json" "$@")
echo "$label | HellaSwag ($n): $hs | ARC-Easy (test): $arc"

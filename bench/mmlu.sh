#!/usr/bin/env bash
# 5-shot MMLU over every subject (lm-eval's prompts, the first five dev questions as examples),
# the first N test questions of each subject; prints each subject's accuracy and the accuracy over
# all questions scored (micro average, as lm-eval's `mmlu` group) with its standard error.
#   bench/mmlu.sh MODEL N [sift eval arguments...]   (SIFT= another binary; DATA= the mmlu folder)
# Issue 18's protocol: bench/mmlu.sh MODEL 18 -t 2 [--prefill-sparsity 0.5 ...] (57 × 18 = 1026).
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1; n=$2; shift 2
sift=${SIFT:-target/release/sift}
data=${DATA:-../shared/data/mc/mmlu}
right=0; total=0
for dir in "$data"/*/; do
  subject=$(basename "$dir")
  out=$("$sift" eval -m "$model" -f "$dir/test.json" --shots 5 --limit "$n" "$@" 2>/dev/null | grep '^acc = ')
  # "acc = 0.2500 +/- 0.0993, acc_norm = ... (N = 20)"
  acc=$(awk '{print $3}' <<<"$out"); cnt=$(sed 's/.*(N = \([0-9]*\)).*/\1/' <<<"$out")
  printf '%-40s %s (N = %s)\n' "$subject" "$acc" "$cnt"
  right=$(awk -v r="$right" -v a="$acc" -v c="$cnt" 'BEGIN{printf "%.0f", r + a * c}')
  total=$((total + cnt))
done
awk -v r="$right" -v t="$total" 'BEGIN{p = r / t; printf "MMLU 5-shot: acc = %.4f +/- %.4f over %d questions\n", p, sqrt(p * (1 - p) / (t - 1)), t}'

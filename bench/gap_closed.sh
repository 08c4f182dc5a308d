#!/usr/bin/env bash
# How much of a selector's perplexity gap a recovered model closes (issue 19), measured so that the
# sparse model's sensitivity does not decide it: at ratio 0.5 a perplexity over 10 chunks moves by
# up to ±1.5 on Qwen2.5-0.5B when the ratio moves by 0.001 or the kernels' last bits change (a
# selection at the boundary flips and the flip carries through the chunk's context;
# docs/sparsity.md, session 26). So the original and the recovered model are both measured at
# R-D, R and R+D through the pack's columns (the path that decodes fast), and the gap closed is
# given per ratio and on the means.
#
#   bench/gap_closed.sh ORIGINAL.sift RECOVERED.sift METHOD R [CHUNKS] [D]
#   bench/gap_closed.sh models/qwen.sift fused.sift topk 0.5 40 0.005
#
# Dense is the original's perplexity without sparsity. SIFT=path picks another sift binary,
# TEXT another evaluation text (default: WikiText-2 raw test).
set -euo pipefail
orig=$1; rec=$2; method=$3; r=$4
chunks=${5:-40}; d=${6:-0.005}
here=$(cd "$(dirname "$0")/.." && pwd)
sift=${SIFT:-$here/target/release/sift}
text=${TEXT:-$here/../shared/data/wikitext-2-raw/wiki.test.raw}
ppl() {
  "$sift" perplexity -m "$1" -f "$text" -c 512 --chunks "$chunks" -t 2 "${@:2}" 2>&1 \
    | grep -o 'PPL = [0-9.]*' | awk '{print $3}' | grep . || { echo "perplexity failed on $1" >&2; exit 1; }
}
dense=$(ppl "$orig")
echo "dense $dense ($chunks chunks of 512)"
sum_o=0; sum_r=0; n=0
for x in $(awk -v r="$r" -v d="$d" 'BEGIN { printf "%.4f %.4f %.4f", r - d, r, r + d }'); do
  o=$(ppl "$orig" --all-columns --sparsity "$method" --ratio "$x")
  c=$(ppl "$rec" --all-columns --sparsity "$method" --ratio "$x")
  echo "$method $x: original $o, recovered $c, gap closed $(awk -v a="$dense" -v o="$o" -v c="$c" 'BEGIN { printf "%.1f %%", 100 * (o - c) / (o - a) }')"
  sum_o=$(awk -v s="$sum_o" -v v="$o" 'BEGIN { print s + v }'); sum_r=$(awk -v s="$sum_r" -v v="$c" 'BEGIN { print s + v }'); n=$((n + 1))
done
awk -v a="$dense" -v so="$sum_o" -v sr="$sum_r" -v n="$n" 'BEGIN {
  o = so / n; c = sr / n
  printf "mean of the three: original %.4f, recovered %.4f, gap closed %.1f %%\n", o, c, 100 * (o - c) / (o - a) }'

#!/usr/bin/env bash
# Perplexity of a selector with and without distilled LoRA adapters (`sift train distill`),
# through the column kernels (`--all-columns`, the path that decodes fast), WikiText-2 raw test,
# llama.cpp's method. The adapters were trained at one ratio; the others check
# "one-distill-all-scale".
#
#   bench/distill_eval.sh PACK LORA "0.35 0.5 0.65" [method] [chunks]
set -euo pipefail
pack=$1; lora=$2; ratios=$3
method=${4:-topk}
chunks=${5:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
sift=${SIFT:-$here/target/release/sift}
text=${TEXT:-$here/../shared/data/wikitext-2-raw/wiki.test.raw}
ppl() { "$sift" perplexity -m "$pack" -f "$text" -c 512 --chunks "$chunks" -t 2 "$@" 2>&1 | grep -o 'PPL = [0-9.]*' || echo failed; }
echo "dense $(ppl)"
for r in $ratios; do
  echo "$method $r $(ppl --all-columns --sparsity "$method" --ratio "$r")"
  echo "$method $r +lora $(ppl --all-columns --sparsity "$method" --ratio "$r" --lora "$lora")"
done

#!/usr/bin/env bash
# Issue 18's speed table: prompt processing (time to first token = prompt tokens / pp tok/s) at
# 512/1K/2K/4K tokens, dense vs FastForward's sparse prefill (random masks = the speed ceiling,
# oracle masks, the trained predictor at 30/40/50 %), sift and llama-bench in the same run.
#   bench/prefill_ttft.sh PACK PREDICTOR [GGUF]   (needs target/release/sift and .ref's llama-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
pack=$1; pred=$2; gguf=${3:-${pack%.sift}.gguf}
sift=${SIFT:-target/release/sift}
lens=512,1024,2048,4096
rows() { grep -E '^\| [a-z0-9]' | grep -v '^| model' | awk -F'|' -v w="$1" '{gsub(/ /,"",$7); print w, $7, $8}'; }
LD_LIBRARY_PATH=.ref/build/bin .ref/build/bin/llama-bench -m "$gguf" -p $lens -n 0 -r 1 -t 2 | rows "llama.cpp dense"
"$sift" bench -m "$pack" -p $lens -n 0 -r 1 -t 2 | rows "sift dense"
"$sift" bench -m "$pack" -p $lens -n 0 -r 1 -t 2 --prefill-sparsity 0.5 --prefill-masks random | rows "sift random 0.5"
"$sift" bench -m "$pack" -p $lens -n 0 -r 1 -t 2 --prefill-sparsity 0.5 --prefill-masks oracle | rows "sift oracle 0.5"
for r in 0.3 0.4 0.5; do
  "$sift" bench -m "$pack" -p $lens -n 0 -r 1 -t 2 --prefill-sparsity $r --prefill-masks predicted \
    --prefill-predictor "$pred" | rows "sift predicted $r"
done

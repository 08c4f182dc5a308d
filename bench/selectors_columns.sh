#!/usr/bin/env bash
# Perplexity of training-free selectors at equal ratios, through the column kernels
# (`--all-columns`, the path that decodes fast): WikiText-2 raw test, llama.cpp's method.
#
#   bench/selectors_columns.sh PACK CALIB "0.3 0.5 0.7" [methods] [chunks]
#
# CALIB: `sift calibrate MODEL -f wiki.test.raw --skip 32768 --tokens 4096 --greedy-tokens 128
# --step 0.1 -o CALIB` (calibration text after the scored chunks). Prints one line per run.
set -euo pipefail
pack=$1; calib=$2; ratios=$3
methods=${4:-"topk wina threshold wina-threshold dip"}
chunks=${5:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
sift=${SIFT:-$here/target/release/sift}
text=${TEXT:-$here/../shared/data/wikitext-2-raw/wiki.test.raw}
echo "dense $("$sift" perplexity -m "$pack" -f "$text" -c 512 --chunks "$chunks" -t 2 2>&1 | grep -o 'PPL = [0-9.]*')"
for r in $ratios; do
  for m in $methods; do
    ppl=$("$sift" perplexity -m "$pack" --all-columns --sparsity "$m" --ratio "$r" --calib "$calib" \
      -f "$text" -c 512 --chunks "$chunks" -t 2 2>&1 | grep -o 'PPL = [0-9.]*' || echo "failed")
    echo "$m $r $ppl"
  done
done

#!/usr/bin/env bash
# Issue 17's table: dense prefill and decode (also at depth 2048) and sparse decode on the column
# file, sift against llama-bench in the same run, per model.
#   bench/kernels_vs_llama.sh MODEL.gguf[:PACK.sift]... (needs target/release/sift and
#   scripts/build-llama-ref.sh's .ref)
# The sparse runs read PACK when given (e.g. one made with `sift pack --col-type wide`), else the
# pack sift finds beside the GGUF. Each test is printed as llama-bench's markdown rows; SIFT=path
# picks another sift binary.
set -euo pipefail
cd "$(dirname "$0")/.."
sift=${SIFT:-target/release/sift}
lb() { LD_LIBRARY_PATH=.ref/build/bin .ref/build/bin/llama-bench "$@" | grep -E '^\| [a-z0-9]'; }
sb() { "$sift" bench "$@" | grep -E '^\| [a-z0-9]' | grep -v '^| model'; }
for arg in "$@"; do
  m=${arg%%:*}
  pack=$m
  [[ $arg == *:* ]] && pack=${arg#*:}
  echo "## $m (sparse runs: $pack)"
  lb -m "$m" -p 512,2048 -n 64 -r 2 -t 2
  lb -m "$m" -p 0 -n 64 -d 2048 -r 2 -t 2
  sb -m "$m" -p 512,2048 -n 64 -r 2 -t 2
  sb -m "$m" -p 0 -n 64 -d 2048 -r 2 -t 2
  for r in 0.5 0.7; do
    echo "sift topk $r:"; sb -m "$pack" --sparsity topk --ratio "$r" -p 0 -n 64 -r 2 -t 2
  done
done

#!/usr/bin/env bash
# Decode speed of sift dense against the FFN-neuron methods at 0.5 (cats, glu) on the packs in
# models/, three alternating rounds: `bash bench/neuron_speed.sh` (SIFT=binary to override).
cd "$(dirname "$0")/.."
B=${SIFT:-target/release/sift}
for M in models/SmolLM2-135M-Instruct.Q4_1.sift models/qwen2.5-coder-0.5b-instruct-q4_k_m.sift; do
for i in 1 2 3; do
  for a in "dense" "cats" "glu"; do
    if [ $a = dense ]; then args=""; else args="--sparsity $a --ratio 0.5"; fi
    echo "$M $a $($B bench -m $M -p 0 -n 64 -t 2 $args 2>&1 | grep -E 'tg' | tail -1)"
  done
done; done

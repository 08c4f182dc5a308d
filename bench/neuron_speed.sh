#!/usr/bin/env bash
# Decode speed of sift dense against the FFN-neuron methods (cats on the pack's rows and columns,
# cats on a pack with neuron bundles, glu) on the packs in models/, three alternating rounds:
# `bash bench/neuron_speed.sh` (SIFT=binary, RATIO=share skipped (0.5), N=tokens (64)).
# The packs with bundles (`sift pack --bundles`) are written to ${TMPDIR:-/tmp} once.
cd "$(dirname "$0")/.."
B=${SIFT:-target/release/sift}
R=${RATIO:-0.5}
N=${N:-64}
T=${TMPDIR:-/tmp}
for M in models/SmolLM2-135M-Instruct.Q4_1.sift models/qwen2.5-coder-0.5b-instruct-q4_k_m.sift models/qwen2.5-coder-1.5b-instruct-q4_k_m.sift; do
  [ -f "$M" ] || continue
  WB="$T/$(basename "$M" .sift).bundles.sift"
  [ -f "$WB" ] || $B pack "${M%.sift}.gguf" -o "$WB" --bundles --force >/dev/null 2>&1
  for i in 1 2 3; do
    for a in dense cats cats-bundles glu; do
      case $a in
        dense) m=$M; args="" ;;
        cats-bundles) m=$WB; args="--sparsity cats --ratio $R" ;;
        *) m=$M; args="--sparsity $a --ratio $R" ;;
      esac
      echo "$M $a $($B bench -m "$m" -p 0 -n "$N" -t 2 $args 2>&1 | grep -E 'tg' | tail -1)"
    done
  done
done

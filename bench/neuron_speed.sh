#!/usr/bin/env bash
# Decode speed of sift dense against the FFN-neuron methods (cats on the pack's neuron bundles,
# cats on a pack without them, glu) on the packs in models/, three alternating rounds:
# `bash bench/neuron_speed.sh` (SIFT=binary, RATIO=share skipped (0.5), N=tokens (64)).
# The packs without bundles are written to ${TMPDIR:-/tmp} once.
cd "$(dirname "$0")/.."
B=${SIFT:-target/release/sift}
R=${RATIO:-0.5}
N=${N:-64}
T=${TMPDIR:-/tmp}
for M in models/SmolLM2-135M-Instruct.Q4_1.sift models/qwen2.5-coder-0.5b-instruct-q4_k_m.sift models/qwen2.5-coder-1.5b-instruct-q4_k_m.sift; do
  [ -f "$M" ] || continue
  NB="$T/$(basename "$M" .sift).no-bundles.sift"
  [ -f "$NB" ] || $B pack "${M%.sift}.gguf" -o "$NB" --no-bundles --force >/dev/null 2>&1
  for i in 1 2 3; do
    for a in dense cats cats-no-bundles glu; do
      case $a in
        dense) m=$M; args="" ;;
        cats-no-bundles) m=$NB; args="--sparsity cats --ratio $R" ;;
        *) m=$M; args="--sparsity $a --ratio $R" ;;
      esac
      echo "$M $a $($B bench -m "$m" -p 0 -n "$N" -t 2 $args 2>&1 | grep -E 'tg' | tail -1)"
    done
  done
done

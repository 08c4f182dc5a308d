#!/usr/bin/env bash
# Peak resident memory (VmHWM) of `sift generate` on a model, next to llama.cpp's llama-completion
# on the same prompt. Usage: bench/peak-memory.sh [MODEL] (default: the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
m=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
prompt="The three primary colors are"
peak() { # run a command, print its VmHWM in MiB (polls /proc while it runs)
  "$@" > /dev/null 2>&1 & pid=$!; hwm=0
  while kill -0 $pid 2>/dev/null; do
    v=$(awk '/VmHWM/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0); [ "${v:-0}" -gt "$hwm" ] && hwm=$v
    sleep 0.02
  done; wait $pid || true; echo "scale=1; $hwm/1024" | bc
}
echo "sift generate (-c 4096, -n 64):      $(peak target/release/sift generate -m "$m" -p "$prompt" -n 64 -t 2 --temp 0) MiB"
if [ -x .ref/build/bin/llama-completion ]; then
  export LD_LIBRARY_PATH=.ref/build/bin
  echo "llama-completion (-c 4096, -n 64):   $(peak .ref/build/bin/llama-completion -m "$m" -p "$prompt" -n 64 -t 2 --temp 0 -c 4096 -no-cnv) MiB"
fi

#!/usr/bin/env bash
# Issue 21's table: 1, 2, 4 and 8 concurrent clients against `sift serve -np N` and
# `llama-server -np N` (N = clients; the same GGUF, -t 2, 512 tokens of context per slot),
# streamed requests of 32 tokens, PAIRS alternating rounds, medians (bench/serve_load.py).
#
#   bash bench/serve_matrix.sh [MODEL] [SIFT_ARGS]       # PAIRS=3 REQ=4 by default
#
# Prints one Markdown row per client count: aggregate tok/s, p50/p99 time to first token and
# between tokens, for both servers, and sift / llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SIFT_ARGS=${2:-}
PAIRS=${PAIRS:-3}
REQ=${REQ:-4}
PEER=${PEER:-.ref/build/bin/llama-server}
mkdir -p bench/out
name=$(basename "$MODEL" .gguf)
echo "| clients | sift tok/s | llama-server tok/s | sift / llama | sift TTFT p50 / p99 (s) | llama TTFT p50 / p99 | sift ITL p50 / p99 (ms) | llama ITL p50 / p99 |"
echo "|---|---|---|---|---|---|---|---|"
for n in 1 2 4 8; do
    out=bench/out/serve_np$n-$name.json
    python3 bench/serve_load.py -m "$MODEL" --clients "$n" --requests "$REQ" --np "$n" --stream \
        --server-args "-t 2 -c 512 $SIFT_ARGS" --peer-llama-server "$PEER" --pairs "$PAIRS" -o "$out" >/dev/null
    python3 - "$n" "$out" <<'PY'
import json, sys
n, r = sys.argv[1], json.load(open(sys.argv[2]))
s, l = r["sift"], r["llama-server"]
f = lambda v, k=1: "-" if v is None else f"{v * k:.2f}"  # noqa: E731
print(f"| {n} | {s['tokens_per_s']:.1f} | {l['tokens_per_s']:.1f} | **{s['tokens_per_s'] / l['tokens_per_s']:.2f}x** | "
      f"{f(s['ttft_p50_s'])} / {f(s['ttft_p99_s'])} | {f(l['ttft_p50_s'])} / {f(l['ttft_p99_s'])} | "
      f"{f(s['itl_p50_s'], 1e3)} / {f(s['itl_p99_s'], 1e3)} | {f(l['itl_p50_s'], 1e3)} / {f(l['itl_p99_s'], 1e3)} |")
PY
done

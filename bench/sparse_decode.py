#!/usr/bin/env python3
"""Decode speed of sparse selection vs dense vs llama.cpp, interleaved, same machine, same session.

Usage (repo root; after scripts/build-llama-ref.sh, cargo build --release and sift pack):
  python3 bench/sparse_decode.py --gguf models/X.gguf --pack models/X.sift -t 2 -n 64 --rounds 3 \
      --configs "dense" "topk 0.5" "dip 0.5"

Each round runs llama-bench (tg, the GGUF) and `sift bench -p 0` for every config (the pack),
in an order that rotates per round. Reports per config the median over rounds of mean tok/s,
min..max, and ratios against llama.cpp and against sift dense.
"""
import argparse, json, os, statistics, subprocess, pathlib

root = pathlib.Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser()
ap.add_argument("--gguf", required=True)
ap.add_argument("--pack", required=True)
ap.add_argument("-t", "--threads", default="2")
ap.add_argument("-n", "--n-gen", default="64")
ap.add_argument("-r", "--reps", default="3")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--configs", nargs="+", default=["dense", "topk 0.5"])
ap.add_argument("--extra", default="", help="extra sift flags for every sparse config, e.g. '--calib F'")
ap.add_argument("--sift", default=str(root / "target/release/sift"))
ap.add_argument("--llama-bench", default=str(root / ".ref/build/bin/llama-bench"))
a = ap.parse_args()

env = dict(os.environ, LD_LIBRARY_PATH=str(root / ".ref/build/bin"))
common = ["-t", a.threads, "-p", "0", "-n", a.n_gen, "-r", a.reps, "-o", "json"]
runs = {"llama.cpp": [a.llama_bench, "-m", a.gguf] + common}
for c in a.configs:
    parts = c.split()
    flags = ["--sparsity", parts[0]] + (["--ratio", parts[1]] if len(parts) > 1 else []) + parts[2:]
    if parts[0] != "dense" and a.extra:
        flags += a.extra.split()
    runs["sift " + c] = [a.sift, "bench", "-m", a.pack] + common + flags
res = {k: [] for k in runs}
names = list(runs)
for rnd in range(a.rounds):
    order = names[rnd % len(names):] + names[:rnd % len(names)]
    for name in order:
        out = subprocess.run(runs[name], capture_output=True, text=True, env=env, check=True).stdout
        res[name].append(json.loads(out)[0]["avg_ts"])
med = {k: statistics.median(v) for k, v in res.items()}
dense = med.get("sift dense")
print(f"| run | tok/s (median of {a.rounds}) | min..max | vs llama.cpp | vs sift dense |")
print("|---|---:|---|---:|---:|")
for k in names:
    v = res[k]
    vd = f"{med[k] / dense:.2f}x" if dense else "-"
    print(f"| {k} | {med[k]:.2f} | {min(v):.2f}..{max(v):.2f} | {med[k] / med['llama.cpp']:.2f}x | {vd} |")

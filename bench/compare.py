#!/usr/bin/env python3
"""sift bench vs llama-bench, interleaved, on the same machine in the same session.

Usage (from the repo root, after scripts/build-llama-ref.sh and cargo build --release):
  python3 bench/compare.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf -t 2 -p 512 -n 128 --rounds 5

Each round runs llama-bench once and `sift bench` once (alternating which goes first), each with
`-r REPS` repetitions and `-o json`. Reports per test the median over rounds of each tool's mean
tok/s, the min..max range, and the ratio sift / llama.cpp of the medians.
"""
import argparse, json, os, statistics, subprocess, sys, pathlib

root = pathlib.Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser()
ap.add_argument("-m", "--model", required=True)
ap.add_argument("-t", "--threads", default="2")
ap.add_argument("-p", "--n-prompt", default="512")
ap.add_argument("-n", "--n-gen", default="128")
ap.add_argument("-r", "--reps", default="3")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--sift", default=str(root / "target/release/sift"))
ap.add_argument("--llama-bench", default=str(root / ".ref/build/bin/llama-bench"))
a = ap.parse_args()

env = dict(os.environ, LD_LIBRARY_PATH=str(root / ".ref/build/bin"))
common = ["-m", a.model, "-t", a.threads, "-p", a.n_prompt, "-n", a.n_gen, "-r", a.reps, "-o", "json"]
tools = {"llama.cpp": [a.llama_bench] + common, "sift": [a.sift, "bench"] + common}
res = {name: {} for name in tools}
for rnd in range(a.rounds):
    order = list(tools) if rnd % 2 == 0 else list(reversed(tools))
    for name in order:
        out = subprocess.run(tools[name], capture_output=True, text=True, env=env, check=True).stdout
        for row in json.loads(out):
            key = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
            res[name].setdefault(key, []).append(row["avg_ts"])
    print(f"round {rnd + 1}/{a.rounds} done", file=sys.stderr)

print(f"model {a.model}, threads {a.threads}, {a.rounds} rounds x {a.reps} reps")
print("| test | llama.cpp t/s (median, min..max) | sift t/s (median, min..max) | sift / llama.cpp |")
print("|---|---|---|---|")
for key in res["sift"]:
    l, s = res["llama.cpp"][key], res["sift"][key]
    ml, ms = statistics.median(l), statistics.median(s)
    print(f"| {key} | {ml:.2f} ({min(l):.1f}..{max(l):.1f}) | {ms:.2f} ({min(s):.1f}..{max(s):.1f}) | {ms / ml:.2f}x |")

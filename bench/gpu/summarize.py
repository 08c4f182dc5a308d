#!/usr/bin/env python3
"""Summarizes bench/gpu/hybrid.sh's hybrid.log: one row per run label (two prompts each):
tok/s of each prompt, and the means of the `hybrid-json` figures. With --lambda FILE.csv, also
writes λ after each token of every tam-adaptive run (token, label, prompt, λ) for a plot."""
import json
import re
import sys
from collections import OrderedDict

log = sys.argv[1]
rows = OrderedDict()
label = None
lam = []
for line in open(log):
    m = re.match(r"== (.*?) \| sift generate -f (\S+)", line)
    if m:
        label, prompt = m.group(1), m.group(2)
        rows.setdefault(label, {"tok_s": [], "json": []})
        continue
    m = re.search(r"eval time .*?([\d.]+) tokens per second", line)
    if m and label:
        rows[label]["tok_s"].append(float(m.group(1)))
    if "hybrid-json" in line and label:
        j = json.loads(line.split("hybrid-json", 1)[1])
        rows[label]["json"].append(j)
        for t, v in enumerate(j.get("lambda", [])):
            lam.append((t, label, prompt, v))

print("| run | tok/s (2 prompts) | p50 / p99 ms | CPU share | loads/token (MiB) | waited |")
print("|---|---|---|---:|---:|---:|")
for label, r in rows.items():
    ts = " / ".join(f"{t:.0f}" for t in r["tok_s"])
    js = r["json"]
    if js:
        mean = lambda k: sum(j[k] for j in js) / len(js)
        print(
            f"| {label} | {ts} | {mean('p50_ms'):.1f} / {mean('p99_ms'):.1f} | {100 * mean('cpu_share'):.0f}% "
            f"| {mean('reloads_per_token'):.0f} ({mean('reload_bytes_per_token') / 2**20:.1f}) "
            f"| {100 * mean('stalled_share'):.0f}% |"
        )
    else:
        print(f"| {label} | {ts} | | | | |")
if len(sys.argv) > 3 and sys.argv[2] == "--lambda":
    with open(sys.argv[3], "w") as f:
        f.write("token,run,prompt,lambda\n")
        for t, l, p, v in lam:
            f.write(f"{t},{l},{p},{v:.4f}\n")

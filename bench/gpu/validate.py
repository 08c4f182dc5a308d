#!/usr/bin/env python3
"""The simulator against the engine (issue 20): bench/gpu/hybrid.sh's VALIDATE=1 output.

    python3 bench/gpu/validate.py validate.log sim-auto.json sim-off.json

validate.log holds real runs (`== POLICY BUDGET ATTENTION | args`, then sift's `eval time` and
`hybrid-json` lines); sim-*.json are `sift simulate --gpu PROFILE -o json` of a trace of the same
prompt, with --gpu-attention auto and off. Prints one row per run: measured and predicted tok/s
and their ratio, CPU share, reloads per token, p50/p99; then the mean and largest error.
"""
import json
import re
import sys


def runs(path):
    out, label = [], None
    for line in open(path, encoding="utf-8", errors="replace"):
        if line.startswith("== "):
            label = line[3:].split(" | ")[0].strip()
            out.append({"label": label})
        elif label and "eval time" in line:
            m = re.search(r"([0-9.]+) tokens per second", line)
            if m:
                out[-1]["tok_s"] = float(m.group(1))
        elif label and "hybrid-json" in line:
            out[-1]["hybrid"] = json.loads(line.split("hybrid-json", 1)[1])
        elif label and "error" in line.lower():
            out[-1]["error"] = line.strip()
    return out


def main():
    measured = runs(sys.argv[1])
    sims = {}
    for path, att in zip(sys.argv[2:4], ["auto", "off"]):
        try:
            for r in json.load(open(path)):
                sims[(r["policy"], r["gpu_memory"], att)] = r
        except (OSError, ValueError) as e:
            print(f"(no simulation {path}: {e})")
    print("| run | placed (simulated) | tok/s measured | predicted | predicted / measured | CPU share meas. / pred. | reloads/token meas. / pred. | p50 / p99 ms meas. | pred. |")
    print("|---|---|---:|---:|---:|---|---|---|---|")
    errors = []
    for r in measured:
        parts = r["label"].split()
        if len(parts) != 3 or "tok_s" not in r:
            print(f"| {r['label']} | | {r.get('tok_s', r.get('error', 'no result'))} | | | | | | |")
            continue
        policy, budget, att = parts
        s = sims.get((policy, budget, "auto" if policy == "layers" else att))
        h = r.get("hybrid", {})
        if not s:
            print(f"| {r['label']} | | {r['tok_s']:.1f} | | | | | | |")
            continue
        ratio = s["tok_s"] / r["tok_s"]
        errors.append(abs(ratio - 1.0))
        cpu = f"{h.get('cpu_share', 0) * 100:.0f} % / {s['cpu_share'] * 100:.0f} %" if h else f"/ {s['cpu_share'] * 100:.0f} %"
        rel = f"{h.get('reloads_per_token', 0):.1f} / {s['reloads_per_token']:.1f}" if h else ""
        p = f"{h['p50_ms']:.2f} / {h['p99_ms']:.2f}" if h else ""
        print(
            f"| {r['label']} | {s['placed']} | {r['tok_s']:.1f} | {s['tok_s']:.1f} | {ratio:.2f} | {cpu} | {rel} | {p} | "
            f"{s['p50_ns'] / 1e6:.2f} / {s['p99_ns'] / 1e6:.2f} |"
        )
    if errors:
        within = sum(e <= 0.2 for e in errors)
        print(
            f"\n{len(errors)} runs: mean |predicted / measured - 1| = {sum(errors) / len(errors) * 100:.1f} %, "
            f"largest {max(errors) * 100:.1f} %, {within} within 20 %"
        )


if __name__ == "__main__":
    main()

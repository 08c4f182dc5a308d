#!/usr/bin/env python3
"""Simulator validation (issue 5): predicted vs measured decode speed on this machine.

Records one trace of a greedy Top-K run (in memory), then for every budget x cache policy runs
`sift generate --memory ...` for real (median of --reps runs) and `sift simulate` on the trace
with the device profile, and writes a table of measured vs predicted tok/s and hit rates.

    python3 bench/validate_simulator.py --model models/qwen2.5-1.5b.sift \
        --profile profiles/sift-dev-2core.toml --out docs/results/simulator

The real runs read weights with O_DIRECT (no page cache), so no cache drop is needed between
runs; each real run's measured runtime memory is passed to the simulator so both plan the same
cache size.
"""
import argparse, json, os, re, statistics, subprocess, sys, time

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sift", default="target/release/sift")
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--budgets", default="45%,55%,65%,80%,100%")
    ap.add_argument("--policies", default="lfu,lru,tam")
    ap.add_argument("--ratio", default="0.5")
    ap.add_argument("--preload", default="4")
    ap.add_argument("-n", default="24")
    ap.add_argument("-c", default="512")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--trace", default="/tmp/sift-validate.trace")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    common = ["-c", a.c, "-n", a.n, "--temp", "0", "-p", PROMPT, "-t", "2"]
    sel = ["--sparsity", "topk", "--ratio", a.ratio]
    t = run([a.sift, "trace", "-m", a.model, *sel, *common, "-o", a.trace])
    print(t.stderr.strip().splitlines()[-1] if t.stderr.strip() else "", file=sys.stderr)
    rows = []
    for b in a.budgets.split(","):
        for pol in a.policies.split(","):
            tps, hits, runtime = [], None, None
            for _ in range(a.reps):
                p = run([a.sift, "generate", "-m", a.model, "--memory", b, "--cache-policy", pol,
                         "--preload", a.preload, *sel, *common])
                m = re.search(r"eval time =.*?\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second", p.stderr.split("prompt eval time")[1])
                tps.append(float(m.group(1)))
                hits = float(re.search(r"hit rate ([\d.]+)%", p.stderr).group(1))
                runtime = re.search(r"runtime (\d+)", p.stderr).group(1)
            s = run([a.sift, "simulate", "--trace", a.trace, "-m", a.model, "--profile", a.profile,
                     "--memory", b, "--policy", pol, "--preload", a.preload, "-c", a.c,
                     "--runtime", f"{runtime}M", "-o", "json"])
            r = json.loads(s.stdout)[0]
            med = statistics.median(tps)
            row = dict(budget=b, policy=pol, measured=med, runs=tps, predicted=r["tok_s"],
                       err=(r["tok_s"] - med) / med * 100, hit_measured=hits,
                       hit_sim=r["hit_rate"] * 100, stall_s=r["stall_s"], compute_s=r["compute_s"],
                       cache_mib=r["plan"]["cache"] / 2**20)
            rows.append(row)
            print(f"{b:>5} {pol:4} measured {med:6.2f} {tps} predicted {r['tok_s']:6.2f} ({row['err']:+.0f}%) "
                  f"hit {hits:.1f}% / sim {row['hit_sim']:.1f}%", file=sys.stderr, flush=True)
    with open(os.path.join(a.out, "validation.csv"), "w") as f:
        f.write("budget,policy,cache_mib,measured_tok_s,predicted_tok_s,error_pct,hit_measured,hit_simulated\n")
        for r in rows:
            f.write(f"{r['budget']},{r['policy']},{r['cache_mib']:.0f},{r['measured']:.3f},{r['predicted']:.3f},"
                    f"{r['err']:.1f},{r['hit_measured']:.1f},{r['hit_sim']:.1f}\n")
    with open(os.path.join(a.out, "validation.md"), "w") as f:
        f.write(f"Model `{a.model}`, Top-K {a.ratio}, preload {a.preload}, -c {a.c}, {a.n} tokens, "
                f"{a.reps} real runs per cell (median), profile `{a.profile}`; {time.strftime('%Y-%m-%d')}.\n\n")
        f.write("| budget | policy | cache MiB | measured tok/s (runs) | predicted tok/s | error | hit rate measured | hit rate simulated |\n")
        f.write("|---:|---|---:|---:|---:|---:|---:|---:|\n")
        for r in rows:
            runs = ", ".join(f"{x:.2f}" for x in r["runs"])
            f.write(f"| {r['budget']} | {r['policy']} | {r['cache_mib']:.0f} | {r['measured']:.2f} ({runs}) | "
                    f"{r['predicted']:.2f} | {r['err']:+.0f}% | {r['hit_measured']:.1f}% | {r['hit_sim']:.1f}% |\n")
        within = sum(1 for r in rows if abs(r["err"]) <= 20)
        f.write(f"\n{within} of {len(rows)} cells within 20%; median |error| "
                f"{statistics.median(abs(r['err']) for r in rows):.0f}%.\n")
    print(open(os.path.join(a.out, "validation.md")).read())


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Planner validation (issue 16): `sift plan`'s predicted tok/s against `sift bench --memory`.

For every model x budget, `--rounds` times: `sift plan` predicts (this machine's kept profile and
the planner's own trace, as a user gets them), then `sift bench --memory` measures (in a cgroup v1
memory limit at the budget + 128 MiB with the page cache dropped, when run as root). Each run also
reports what it measured of the machine (its read bandwidth against the profile's disk table, the
read path's CPU); a second prediction with *that run's* correction alone ("post hoc") separates
the model's error from the disk's drift between runs. Runs fold their corrections into the kept
profile, so later predictions learn from earlier runs, as a user's do.

    sudo python3 bench/validate_planner.py \\
        --models /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf,/work/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --budgets 80,60 --rounds 3

Prints a markdown table (one row per run) and the median error per model x budget.
"""
import argparse, glob, json, os, re, statistics, subprocess, sys, tempfile

ARGS = ["--sparsity", "topk", "--ratio", "0.5", "--preload", "0", "-p", "0", "-n", "48", "-r", "1", "-t", "2"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p


def plan(sift, model, pct, profile=None):
    cmd = [sift, "plan", "-m", model, "--memory", f"{pct}%", "--ratio", "0.5", "-c", "4096", "-o", "json"]
    if profile:
        cmd += ["--profile", profile]
    return json.loads(run(cmd).stdout)["predicted_tok_s"]


def in_cgroup(limit_mib, cmd):
    """Runs cmd in a fresh cgroup-v1 memory cgroup after dropping the page cache (root only)."""
    if os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/memory"):
        return run(cmd)
    cg = f"/sys/fs/cgroup/memory/sift-validate-{os.getpid()}"
    os.makedirs(cg, exist_ok=True)
    with open(f"{cg}/memory.limit_in_bytes", "w") as f:
        f.write(str(limit_mib << 20))
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    try:
        return run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *cmd])
    finally:
        os.rmdir(cg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sift", default="target/release/sift")
    ap.add_argument("--models", required=True, help="comma-separated GGUF or pack paths")
    ap.add_argument("--budgets", default="80,60", help="percentages of the model size")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    print("| round | model | budget | predicted | measured | error | post hoc | error | read MB/s busy | disk scale | read path ns/B |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rnd in range(1, a.rounds + 1):
        for model in a.models.split(","):
            size = os.path.getsize(model)
            for pct in [int(b) for b in a.budgets.split(",")]:
                pred = plan(a.sift, model, pct)
                p = in_cgroup(size * pct // 100 // (1 << 20) + 128,
                              [a.sift, "bench", "-m", model, "--memory", f"{pct}%", *ARGS])
                meas = float(re.search(r"sift: decode ([\d.]+) tok/s", p.stderr).group(1))
                busy = int(re.search(r"(\d+) MB/s while busy", p.stderr).group(1))
                m = re.search(r"reads at ([\d.]+)x the profile's disk table, read path ([\d.]+) ns", p.stderr)
                scale, io = float(m.group(1)), float(m.group(2))
                # This run's correction alone, on this machine's kept profile.
                kept = glob.glob(os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "sift", "machine-*.toml"))
                text = open(kept[0]).read().split("\n[observed]\n")[0].rstrip()
                with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                    f.write(f"{text}\n\n[observed]\nruns = 1\ndisk_scale = {scale}\nio_cpu_ns_per_byte = {io}\n")
                post = plan(a.sift, model, pct, f.name)
                os.unlink(f.name)
                name = os.path.basename(model)
                rows.append((name, pct, pred, meas, post))
                print(f"| {rnd} | {name} | {pct} % | {pred:.2f} | {meas:.2f} | {100 * (pred / meas - 1):+.0f} % "
                      f"| {post:.2f} | {100 * (post / meas - 1):+.0f} % | {busy} | {scale:.2f} | {io:.2f} |", flush=True)
    print("\n| model | budget | median predicted / measured | median post hoc / measured |")
    print("|---|---:|---:|---:|")
    for key in dict.fromkeys((r[0], r[1]) for r in rows):
        sel = [r for r in rows if (r[0], r[1]) == key]
        e = statistics.median(r[2] / r[3] for r in sel)
        ph = statistics.median(r[4] / r[3] for r in sel)
        print(f"| {key[0]} | {key[1]} % | {e:.2f} | {ph:.2f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Interleaved A/B pairs of two sift binaries on the same `sift bench` command: is a change
within noise?

Usage (repo root):
  python3 bench/ab.py --a /tmp/sift-before --b target/release/sift --pairs 7 \
      -- bench -m models/smol.sift -t 2 -p 0 -n 64 -r 1 --sparsity topk --ratio 0.5

Each pair runs A then B (the order alternates every pair, so drift hits both alike); every run
is `BINARY ARGS -o json` and its tokens/s are read from the JSON (every test entry). With
--serve, each run is instead `python3 bench/serve_load.py --sift BINARY ARGS` (the server under
load: ARGS are serve_load.py's flags) and its aggregate tokens/s is compared:

  python3 bench/ab.py --serve --a /tmp/sift-before --b target/release/sift --pairs 7 \
      -- --clients 4 --requests 2 --max-tokens 32 --server-args "-t 2 -c 512" Prints
each pair's B/A ratio and the median ratio with its min..max. A budgeted run (`--memory`) that
should start cold can be given `--drop-caches` (root: writes /proc/sys/vm/drop_caches before each
run). Results go to stdout and, with --json, to a file.
"""
import argparse, json, statistics, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("--a", required=True, help="binary A (before)")
ap.add_argument("--b", required=True, help="binary B (after)")
ap.add_argument("--pairs", type=int, default=7)
ap.add_argument("--drop-caches", action="store_true")
ap.add_argument("--serve", action="store_true", help="A/B bench/serve_load.py runs of the two binaries")
ap.add_argument("--json", help="write the runs here")
ap.add_argument("args", nargs=argparse.REMAINDER)
a = ap.parse_args()
args = a.args[1:] if a.args[:1] == ["--"] else a.args


def run(binary):
    if a.drop_caches:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    if a.serve:
        cmd = [sys.executable, "bench/serve_load.py", "--sift", binary] + args
    else:
        cmd = [binary] + args + ["-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{binary} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    if a.serve:
        return [json.loads(out.stdout)["tokens_per_s"]]
    return [t["avg_ts"] for t in json.loads(out.stdout)]


rows = []
for p in range(a.pairs):
    order = [("a", a.a), ("b", a.b)] if p % 2 == 0 else [("b", a.b), ("a", a.a)]
    got = {k: run(binary) for k, binary in order}
    ratio = [b / x for b, x in zip(got["b"], got["a"])]
    rows.append({"a": got["a"], "b": got["b"], "ratio": ratio})
    print(f"pair {p + 1}: A {' '.join(f'{v:.2f}' for v in got['a'])}  B {' '.join(f'{v:.2f}' for v in got['b'])}"
          f"  B/A {' '.join(f'{r:.3f}' for r in ratio)}", flush=True)
for i in range(len(rows[0]["ratio"])):
    r = [row["ratio"][i] for row in rows]
    med_a = statistics.median(row["a"][i] for row in rows)
    med_b = statistics.median(row["b"][i] for row in rows)
    print(f"test {i}: median A {med_a:.2f} tok/s, B {med_b:.2f} tok/s; B/A median {statistics.median(r):.3f} "
          f"(min {min(r):.3f}, max {max(r):.3f}) over {len(r)} pairs")
if a.json:
    json.dump({"args": args, "a": a.a, "b": a.b, "pairs": rows}, open(a.json, "w"), indent=1)

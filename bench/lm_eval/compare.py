#!/usr/bin/env python3
"""lm-eval-harness against `sift serve`, compared with `sift eval` on the same items.

Starts `sift serve` on a free loopback port, runs lm-eval's `local-completions` model on the
local ARC-Easy task (bench/lm_eval/arc_easy_sift.yaml, built from ../shared/data) with the
server's own tokenizer (`tokenizer_backend=remote`: /tokenizer_info, /tokenize, /detokenize),
then runs `sift eval` on the same file and items with the same flags, and compares acc and
acc_norm. Exit status 1 if they differ.

  python3 -m venv .ref/lmeval && .ref/lmeval/bin/pip install "lm-eval[api]==0.4.13"
  cargo build --release
  python3 bench/lm_eval/compare.py --lm-eval .ref/lmeval/bin/lm_eval --limit 200 \
      [--sift-args "--sparsity topk --ratio 0.5"] [-o docs/results/serve/lm_eval_arc_easy.json]

Run from the repository root (the task's data path is relative to it).
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

DATA = "../shared/data/mc/arc-easy/test.json"


def start_server(sift, model, extra):
    cmd = [sift, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0"] + extra
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = srv.stderr.readline()
        if not line:
            break
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            return srv, m.group(1)
    srv.kill()
    sys.exit(f"sift serve did not start: {' '.join(cmd)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sift", default="target/release/sift")
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--lm-eval", default=".ref/lmeval/bin/lm_eval", help="the lm_eval executable")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--sift-args", default="", help="flags for both `sift serve` and `sift eval`")
    ap.add_argument("-o", "--output", help="write the comparison as JSON here")
    a = ap.parse_args()
    extra = shlex.split(a.sift_args)
    alias = os.path.splitext(os.path.basename(a.model))[0]

    srv, addr = start_server(a.sift, a.model, extra)
    out_dir = tempfile.mkdtemp(prefix="sift-lm-eval-")
    try:
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        model_args = f"base_url=http://{addr}/v1/completions,model={alias},tokenizer_backend=remote"
        cmd = [a.lm_eval, "--model", "local-completions", "--model_args", model_args,
               "--include_path", "bench/lm_eval", "--tasks", "arc_easy_sift", "--limit", str(a.limit),
               "--output_path", out_dir]
        print("$", shlex.join(cmd), file=sys.stderr)
        t0 = time.time()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        lm_seconds = time.time() - t0
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    res = json.load(open(glob.glob(f"{out_dir}/*/results_*.json")[0]))["results"]["arc_easy_sift"]
    lm = {"acc": res["acc,none"], "acc_norm": res["acc_norm,none"], "n": res["sample_len"], "seconds": lm_seconds}

    cmd = [a.sift, "eval", "-m", a.model, "-f", DATA, "--task", "arc", "--limit", str(a.limit), "-o", "json"] + extra
    print("$", shlex.join(cmd), file=sys.stderr)
    se = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    sift = {"acc": se["acc"], "acc_norm": se["acc_norm"], "n": se["n"], "seconds": se["seconds"]}

    same = lm["n"] == sift["n"] and abs(lm["acc"] - sift["acc"]) < 1e-9 and abs(lm["acc_norm"] - sift["acc_norm"]) < 1e-9
    print(f"{'':22} {'n':>5} {'acc':>7} {'acc_norm':>9} {'seconds':>8}")
    for name, r in [("lm-eval -> sift serve", lm), ("sift eval", sift)]:
        print(f"{name:22} {r['n']:>5} {r['acc']:>7.4f} {r['acc_norm']:>9.4f} {r['seconds']:>8.1f}")
    print("equal" if same else "DIFFERENT")
    if a.output:
        os.makedirs(os.path.dirname(a.output) or ".", exist_ok=True)
        with open(a.output, "w") as f:
            json.dump({"model": a.model, "task": "arc_easy_sift", "data": DATA, "limit": a.limit,
                       "sift_args": a.sift_args, "lm_eval": lm, "sift_eval": sift, "equal": same}, f, indent=2)
            f.write("\n")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()

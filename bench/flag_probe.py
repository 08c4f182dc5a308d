#!/usr/bin/env python3
# Issue 22 probe: every numeric option of each subcommand at hostile values (2^40, 2^62, 2^64,
# -1, inf, nan, 1e30, 0); prints the runs that panic, abort, are killed or time out, and the
# hostile values a command accepted. Run from the repository root:
#   python3 bench/flag_probe.py [SUBCOMMAND...]   (SIFT= another binary)
import subprocess, re, sys, os
S = os.environ.get("SIFT", "target/release/sift")
M = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
P = "models/SmolLM2-135M-Instruct.Q4_1.sift"
TXT = "tests/fixtures/wiki.test.head16k.raw"
base = {
 "generate": ["-m", M, "-p", "Hello", "-n", "2", "-t", "1"],
 "perplexity": ["-m", M, "-f", TXT, "-c", "128", "--chunks", "1", "-t", "1"],
 "bench": ["-m", M, "-p", "8", "-n", "2", "-r", "1", "-t", "1"],
 "calibrate": [M, "-f", TXT, "-o", "/tmp/c.json", "-t", "1"],
 "trace": ["-m", M, "-p", "Hello", "-n", "2", "-o", "/tmp/t.trace", "-t", "1"],
 "plan": ["-m", M],
 "simulate": [],
 "eval": ["-m", M, "-f", "crates/eval/tests/fixtures/arc-easy-test-first40.jsonl", "--limit", "1", "-t", "1"],
 "sweep": ["-m", M, "-f", TXT, "-t", "1"],
 # A server that accepts its flags listens until the probe's timeout: that run counts as
 # accepted, not hung (SERVE_TIMEOUT seconds).
 "serve": ["-m", M, "--port", "0", "-t", "1"],
 "chat": ["-m", M, "-n", "2", "-t", "1"],
 "train prefill": ["-m", M, "-f", TXT, "--steps", "1", "--blocks", "2", "--compensator-steps", "1", "--seq-blocks", "2", "-o", "/tmp/probe.prefill", "--force", "-t", "1"],
 "train distill": ["-m", M, "-f", TXT, "--steps", "1", "--sparsity", "topk", "--ratio", "0.5", "--tokens", "64", "--seq", "32", "-o", "/tmp/probe.lora.gguf", "--force", "-t", "1"],
 "export-lora": ["-m", M, "--lora", "/tmp/probe.lora.gguf", "-o", "/tmp/probe.fused.gguf", "--force"],
}
SERVE_TIMEOUT = 4
vals = ["1099511627776", "4611686018427387904", "-1", "inf", "nan", "1e30", "0", "18446744073709551616"]
skip = {"--help", "--version"}
cmds = sys.argv[1:] or list(base)
runs = 0
for cmd in cmds:
    h = subprocess.run([S, *cmd.split(), "--help"], capture_output=True, text=True).stdout
    opts = re.findall(r"^\s+(?:-\w, )?(--[\w-]+) <", h, re.M)
    for o in opts:
        if o in ("--model", "--file", "--prompt", "--output", "--out", "--calib", "--profile", "--trace", "--sparsity-config", "--pack-dir", "--budget-file", "--prefill-predictor", "--shots-file", "--lora", "--grammar-file", "--json-schema", "--chat-template-file", "--chat-template", "--host", "--api-key", "--path", "--log-file"):
            continue
        for v in vals:
            runs += 1
            args = [S, *cmd.split()] + base.get(cmd, []) + [o, v]
            try:
                if cmd == "serve":
                    pr = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
                    try:
                        out, err = pr.communicate(timeout=SERVE_TIMEOUT)
                    except subprocess.TimeoutExpired:
                        pr.kill()
                        out, err = pr.communicate()
                        if "panicked" in err:
                            print(f"{cmd} {o} {v}: PANIC {err.strip().splitlines()[-1][:150]}", flush=True)
                        elif v not in ("0",):
                            print(f"{cmd} {o} {v}: accepted (serving)", flush=True)
                        continue
                    r = subprocess.CompletedProcess(args, pr.returncode, out, err)
                else:
                    r = subprocess.run(args, capture_output=True, text=True, timeout=40, stdin=subprocess.DEVNULL)
                bad = r.returncode not in (0, 1, 2) or "panicked" in r.stderr
                if bad or (r.returncode == 0 and v in ("1099511627776", "4611686018427387904", "inf", "nan", "1e30", "-1")):
                    print(f"{cmd} {o} {v}: rc={r.returncode} {'PANIC ' if 'panicked' in r.stderr else ''}{r.stderr.strip().splitlines()[-1][:150] if r.stderr.strip() else ''}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{cmd} {o} {v}: TIMEOUT", flush=True)
print(f"{runs} runs", flush=True)

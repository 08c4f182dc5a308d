#!/usr/bin/env python3
"""Issue 22's server memory case: 8 concurrent 1.8 MB /tokenize requests against
`sift serve --memory BUDGET`; prints the server's peak (VmHWM) and resident (VmRSS) memory before,
after one request and after the eight.

    python3 bench/serve_tokenize_memory.py [PACK] [BUDGET] [TEXT]
    (defaults: models/SmolLM2-135M-Instruct.Q4_1.sift, 130M, ../shared/data/wikitext-2-raw/wiki.test.raw)

With SIFT_CGROUP=1 (root, cgroup v1) the server runs in a memory cgroup limited to the budget +
128 MiB, and the cgroup's peak and limit hits are printed too. After the /tokenize burst, two
completions: a 1.8 MB prompt (refused: longer than the context), one of ~3,500 tokens (its KV cache
does not fit a 130M budget: refused), and ones of ~1,500 and ~770.
"""
import json, os, subprocess, sys, threading, time, urllib.error, urllib.request

pack = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.sift"
budget = sys.argv[2] if len(sys.argv) > 2 else "130M"
text_path = sys.argv[3] if len(sys.argv) > 3 else "../shared/data/wikitext-2-raw/wiki.test.raw"
port = 18177
cmd = ["target/release/sift", "serve", "-m", pack, "--memory", budget, "--port", str(port), "-t", "1"]
cg = None
if os.environ.get("SIFT_CGROUP"):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    limit = int(float(budget[:-1]) * units[budget[-1]]) + (128 << 20)
    cg = "/sys/fs/cgroup/memory/sift-serve-probe"
    os.makedirs(cg, exist_ok=True)
    open(f"{cg}/memory.limit_in_bytes", "w").write(str(limit))
    open(f"{cg}/memory.max_usage_in_bytes", "w").write("0")
    open(f"{cg}/memory.failcnt", "w").write("0")
    print(f"cgroup {cg}: limit {limit} bytes (budget {budget} + 128 MiB)")
    cmd = ["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec " + " ".join(cmd)]
srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
for line in srv.stderr:
    if "listening on" in line:
        break
def mem():
    f = dict(l.split(":", 1) for l in open(f"/proc/{srv.pid}/status"))
    return f"VmHWM {f['VmHWM'].strip()}, VmRSS {f['VmRSS'].strip()}"
text = open(text_path, encoding="utf-8").read()
text = (text * 2)[:1800000]
def one(out):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"content": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    out.append(json.loads(urllib.request.urlopen(req, timeout=600).read())["count"])
try:
    print("started:", mem())
    counts = []
    one(counts)
    print(f"one request ({counts[0]} tokens):", mem())
    ts = [threading.Thread(target=one, args=(counts,)) for _ in range(8)]
    t0 = time.time()
    [t.start() for t in ts]
    [t.join() for t in ts]
    print(f"eight concurrent ({time.time() - t0:.1f} s, {len(set(counts))} distinct counts):", mem())
    def complete(prompt):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps({"prompt": prompt, "max_tokens": 4}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            r = json.loads(urllib.request.urlopen(req, timeout=600).read())
            return f"ok, {r['usage']['prompt_tokens']} prompt tokens"
        except urllib.error.HTTPError as e:
            return f"{e.code} {json.loads(e.read())['error']['message'][:90]}"
    t0 = time.time()
    print(f"1.8 MB completion prompt: {complete(text)} ({time.time() - t0:.1f} s):", mem())
    for n in (14000, 6000, 3000):
        t0 = time.time()
        print(f"{n // 1000} KB completion prompt: {complete(text[:n])} ({time.time() - t0:.1f} s):", mem())
    if cg:
        peak = int(open(f"{cg}/memory.max_usage_in_bytes").read())
        fails = open(f"{cg}/memory.failcnt").read().strip()
        print(f"cgroup peak usage (RSS + page cache) {peak >> 20} MiB, limit hits {fails}")
finally:
    srv.terminate()
    srv.wait()

#!/usr/bin/env python3
"""Issue 22's server memory case: 8 concurrent 1.8 MB /tokenize requests against
`sift serve --memory BUDGET`; prints the server's peak (VmHWM) and resident (VmRSS) memory before,
after one request and after the eight.

    python3 bench/serve_tokenize_memory.py [PACK] [BUDGET] [TEXT]
    (defaults: models/SmolLM2-135M-Instruct.Q4_1.sift, 130M, ../shared/data/wikitext-2-raw/wiki.test.raw)
"""
import json, subprocess, sys, threading, time, urllib.request

pack = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.sift"
budget = sys.argv[2] if len(sys.argv) > 2 else "130M"
text_path = sys.argv[3] if len(sys.argv) > 3 else "../shared/data/wikitext-2-raw/wiki.test.raw"
port = 18177
srv = subprocess.Popen(["target/release/sift", "serve", "-m", pack, "--memory", budget, "--port", str(port), "-t", "1"],
                       stderr=subprocess.PIPE, text=True)
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
finally:
    srv.terminate()
    srv.wait()

#!/usr/bin/env python3
"""Issue 63's server memory target: `sift serve -m PACK --memory BUDGET -np 4` in a cgroup v1
memory limit of the budget + MARGIN (default 32 MiB), 8 concurrent clients for ROUNDS rounds each,
mixing 2 MB `/tokenize` with pieces, completions and chat (short, ~400-token and 2 MB prompts, the
last refused: past the context); every request must be answered (200 or
4xx), the server must live, and its peak memory stay inside the limit.

    SIFT_CGROUP=1 python3 bench/serve_budget_load.py [PACK] [BUDGET] [ROUNDS] [MARGIN_MIB]
    (defaults: /tmp/q/q.sift, 60%, 6, 32)

Prints per request kind the status codes seen, the server's peak RSS (VmHWM), and with the
cgroup its peak usage (RSS + page cache, which the kernel reclaims at the limit), limit hits and
OOM kills. Root and cgroup v1 are needed for the cgroup; without SIFT_CGROUP only the RSS is
reported.
"""
import json, os, random, subprocess, sys, threading, time, urllib.error, urllib.request

pack = sys.argv[1] if len(sys.argv) > 1 else "/tmp/q/q.sift"
budget = sys.argv[2] if len(sys.argv) > 2 else "60%"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
margin = int(sys.argv[4]) if len(sys.argv) > 4 else 32
sift = os.environ.get("SIFT", "target/release/sift")
cmd = [sift, "serve", "-m", pack, "--memory", budget, "-np", "4", "-c", "2048", "--port", "0", "-t", "2"]

# The budget in bytes, as the server states it ("budget N MiB" in its plan line) — read after it
# starts when given as a percentage; the cgroup is set before the server joins it, so a
# percentage is resolved first by a plan run.
def budget_bytes():
    if budget.endswith("%"):
        out = subprocess.run([sift, "plan", "-m", pack, "--memory", budget, "-o", "json"], capture_output=True, text=True)
        return json.loads(out.stdout)["memory"]["budget"]
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(budget[:-1]) * units[budget[-1]])

cg = None
limit = None
if os.environ.get("SIFT_CGROUP"):
    b = budget_bytes()
    limit = b + (margin << 20)
    cg = "/sys/fs/cgroup/memory/sift-serve-budget"
    os.makedirs(cg, exist_ok=True)
    open(f"{cg}/memory.limit_in_bytes", "w").write(str(limit))
    open(f"{cg}/memory.max_usage_in_bytes", "w").write("0")
    open(f"{cg}/memory.failcnt", "w").write("0")
    print(f"cgroup {cg}: limit {limit >> 20} MiB (budget {b >> 20} MiB + {margin} MiB)")
    cmd = ["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec " + " ".join(cmd)]
srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
addr = None
log = []
for line in srv.stderr:
    log.append(line)
    if "listening on" in line:
        addr = line.split("http://")[1].split()[0]
        break
if addr is None:
    sys.exit("the server did not start:\n" + "".join(log))
threading.Thread(target=lambda: [log.append(l) for l in srv.stderr], daemon=True).start()

def status():
    f = dict(l.split(":", 1) for l in open(f"/proc/{srv.pid}/status"))
    return int(f["VmHWM"].split()[0]) << 10, int(f["VmRSS"].split()[0]) << 10

words = "hello world, this is a test of the tokenizer " * 50000
big = words[: 2_000_000 - 100]
def post(path, body):
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except Exception as e:  # a reset connection: the server died or dropped it
        return f"failed: {type(e).__name__}"

kinds = {
    "tokenize 2 MB, pieces": lambda: post("/tokenize", {"prompt": big, "with_pieces": True}),
    "completion": lambda: post("/v1/completions", {"prompt": "The history of the city of", "max_tokens": 16, "temperature": 0}),
    "chat": lambda: post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a haiku about rust."}], "max_tokens": 16}),
    "completion, 400-token prompt": lambda: post("/v1/completions", {"prompt": words[:1800], "max_tokens": 8}),
    "completion, 2 MB prompt (past the context)": lambda: post("/v1/completions", {"prompt": big, "max_tokens": 4}),
    "chat, 2 MB message (past the context)": lambda: post("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 4}),
}
seen = {k: {} for k in kinds}
lock = threading.Lock()
def client(i):
    rng = random.Random(i)
    names = list(kinds)
    for _ in range(rounds):
        k = rng.choice(names)
        s = kinds[k]()
        with lock:
            seen[k][s] = seen[k].get(s, 0) + 1
t0 = time.time()
ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
alive = srv.poll() is None
hwm, rss = status() if alive else (0, 0)
print(f"{8 * rounds} requests in {time.time() - t0:.1f} s; server alive: {alive}")
for k, v in seen.items():
    print(f"  {k}: {v}")
print(f"server peak RSS (VmHWM) {hwm >> 20} MiB, RSS now {rss >> 20} MiB")
ok = alive and all(isinstance(s, int) and s < 500 for v in seen.values() for s in v)
if cg:
    peak = int(open(f"{cg}/memory.max_usage_in_bytes").read())
    fails = open(f"{cg}/memory.failcnt").read().strip()
    oom = [l for l in open(f"{cg}/memory.oom_control").read().splitlines() if l.startswith("oom_kill")]
    print(f"cgroup: peak usage {peak >> 20} MiB of {limit >> 20} MiB, limit hits {fails}, {' '.join(oom)}")
    ok = ok and hwm <= limit
srv.terminate()
srv.wait()
if cg:
    try:
        os.rmdir(cg)
    except OSError:
        pass
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)

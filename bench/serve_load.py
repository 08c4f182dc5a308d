#!/usr/bin/env python3
"""Bounded load test of `sift serve` on loopback: N clients x M requests, requests/s, p50/p99
latency, errors, and the server's resident memory (VmRSS, sampled from /proc/PID/status every
--sample-ms throughout) against its --memory budget.

It starts the server itself (loopback only, port 0 parsed from the listening line), so the RSS
it samples is the server's. Standard library only.

  python3 bench/serve_load.py --sift target/release/sift -m models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --clients 8 --requests 4 --max-tokens 32 [--server-args "--memory 140M --sparsity topk ..."] \
      [--peer-llama-server .ref/build/bin/llama-server --pairs 3] [-o bench/out/serve_load.json]

With SIFT_CGROUP=1 (root, cgroup v1) and --memory, the server runs in a memory cgroup of its budget
+ 128 MiB; its peak usage and limit hits are reported.

With --peer-llama-server, llama.cpp's server runs the same load on the same GGUF (one slot,
`-np 1`, like sift's one sequence at a time, unless --peer-parallel; the same -t and -c), alternating sift / peer for
--pairs rounds; the medians and sift/peer ratios are reported.

Exit status 1 if any request failed or (with --budget-mib / --memory in --server-args) the
sampled RSS ever exceeded the budget.
"""
import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "The three primary colors are",
    "def fibonacci(n):",
    "Write a haiku about the sea:",
    "The best way to learn a language is",
]


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def parse_mib(spec):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]?)(i?B)?\s*", spec, re.I)
    if not m:
        return None
    v = float(m.group(1))
    return v * {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024}[m.group(2).upper()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sift", default="target/release/sift")
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--server-args", default="", help="extra flags for sift serve (quoted)")
    ap.add_argument("--budget-mib", type=float, help="RSS limit to check (default: from --memory if in bytes)")
    ap.add_argument("--sample-ms", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    ap.add_argument("--peer-llama-server", help="llama-server binary: run the same load on it too")
    ap.add_argument("--peer-parallel", type=int, default=1,
                    help="llama-server slots (-np); 1 = one sequence at a time like sift, more = its batching")
    ap.add_argument("--pairs", type=int, default=3, help="sift / peer rounds with --peer-llama-server")
    ap.add_argument("--np", type=int, default=1,
                    help="slots for both servers (-np N; -c, if given, is per slot and multiplied by N for both)")
    ap.add_argument("--stream", action="store_true",
                    help="streamed requests: also time to first token and between tokens (p50/p99)")
    ap.add_argument("-o", "--out", help="write the results as JSON")
    a = ap.parse_args()

    extra = shlex.split(a.server_args)
    if a.np > 1:
        a.peer_parallel = a.np
        if "-c" in extra:
            extra[extra.index("-c") + 1] = str(int(extra[extra.index("-c") + 1]) * a.np)
    budget = a.budget_mib
    if budget is None and "--memory" in extra:
        budget = parse_mib(extra[extra.index("--memory") + 1])
    if not a.peer_llama_server:
        res = run_load(a, start_sift(a, extra), budget)
        res["server_args"] = extra
        report(a, res, [res])
        return
    runs = {"sift": [], "llama-server": []}
    for i in range(a.pairs):
        for name in ("sift", "llama-server"):
            srv = start_sift(a, extra) if name == "sift" else start_llama_server(a, extra)
            r = run_load(a, srv, budget if name == "sift" else None)
            print(f"round {i + 1} {name}: {r['requests_per_s']:.3f} req/s, p50 {r['latency_p50_s']:.2f} s, "
                  f"peak RSS {r['rss_peak_mib']:.0f} MiB, {r['errors']} errors", file=sys.stderr)
            runs[name].append(r)
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    keys = ["requests_per_s", "tokens_per_s", "latency_p50_s", "latency_p99_s", "rss_peak_mib"]
    if a.stream:
        keys += ["ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"]
    res = {name: {k: med(rs, k) for k in keys} | {"errors": sum(r["errors"] for r in rs)} for name, rs in runs.items()}
    res["ratio_sift_over_peer"] = {k: res["sift"][k] / res["llama-server"][k] for k in keys}
    res.update({"peer_parallel": a.peer_parallel, "pairs": a.pairs, "clients": a.clients, "requests_per_client": a.requests,
                "max_tokens": a.max_tokens, "server_args": extra, "runs": runs})
    report(a, res, runs["sift"] + runs["llama-server"])


CGROUP = "/sys/fs/cgroup/memory/sift-serve-load"


def start_sift(a, extra):
    cmd = [a.sift, "serve", "--host", "127.0.0.1", "--port", "0", "-m", a.model,
           "--max-queue", str(max(16, a.clients))] + (["-np", str(a.np)] if a.np > 1 else []) + extra
    budget = parse_mib(extra[extra.index("--memory") + 1]) if "--memory" in extra else None
    if os.environ.get("SIFT_CGROUP") and budget:
        # Root, cgroup v1: the server in a memory cgroup of its budget + 128 MiB.
        os.makedirs(CGROUP, exist_ok=True)
        for k, v in (("limit_in_bytes", int((budget + 128) * 2**20)), ("max_usage_in_bytes", 0), ("failcnt", 0)):
            with open(f"{CGROUP}/memory.{k}", "w") as f:
                f.write(str(v))
        cmd = ["sh", "-c", f"echo $$ > {CGROUP}/cgroup.procs && exec {shlex.join(cmd)}"]
    srv = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    t_start = time.time()
    for line in srv.stderr:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
            return srv, m.group(1)
        if time.time() - t_start > 120:
            break
    srv.kill()
    sys.exit(f"sift serve did not start: {shlex.join(cmd)}")


def start_llama_server(a, extra):
    """llama.cpp's server on the same GGUF: --peer-parallel slots, the same -t / -c as given to sift
    (with several slots llama-server splits -c between them, so it is multiplied to keep each
    sequence's context; with --np the given -c is already multiplied for both servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    same = []
    for flag in ("-t", "-c"):
        if flag in extra:
            v = extra[extra.index(flag) + 1]
            same += [flag, str(int(v) * a.peer_parallel) if flag == "-c" and a.np <= 1 else v]
    cmd = [a.peer_llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(a.peer_parallel),
           "--no-webui"] + same
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addr = f"127.0.0.1:{port}"
    t_start = time.time()
    while time.time() - t_start < 120:
        try:
            if urllib.request.urlopen(f"http://{addr}/health", timeout=2).status == 200:
                return srv, addr
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    srv.kill()
    sys.exit(f"llama-server did not start: {shlex.join(cmd)}")


def run_load(a, started, budget):
    """N clients x M requests against one server; stops the server afterwards."""
    srv, addr = started
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            r = rss_kib(srv.pid)
            if r is not None:
                samples.append((time.time(), r / 1024))
            time.sleep(a.sample_ms / 1000)

    threading.Thread(target=sampler, daemon=True).start()
    lat, errors, tokens, ttft, itl = [], [], [0], [], []
    lock = threading.Lock()

    def streamed(r, t0):
        """Reads an SSE completion: (tokens, time to first text, gaps between texts)."""
        first, last, gaps, n, usage = None, None, [], 0, None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            v = json.loads(line[6:])
            usage = (v.get("usage") or {}).get("completion_tokens", usage)
            if any(c.get("text") for c in v.get("choices") or []):
                now = time.time()
                n += 1
                if first is None:
                    first = now - t0
                else:
                    gaps.append(now - last)
                last = now
        return (usage if usage is not None else n), first, gaps

    def client(c):
        for j in range(a.requests):
            req_body = {"prompt": PROMPTS[(c + j) % len(PROMPTS)], "max_tokens": a.max_tokens,
                        "temperature": 0.7, "seed": c * 1000 + j}
            if a.stream:
                req_body |= {"stream": True, "stream_options": {"include_usage": True}}
            req = urllib.request.Request(f"http://{addr}/v1/completions", data=json.dumps(req_body).encode(),
                                         headers={"Content-Type": "application/json"})
            t0 = time.time()
            try:
                with urllib.request.urlopen(req, timeout=a.timeout) as r:
                    if a.stream:
                        n, first, gaps = streamed(r, t0)
                    else:
                        n, first, gaps = json.load(r)["usage"]["completion_tokens"], None, []
                with lock:
                    lat.append(time.time() - t0)
                    tokens[0] += n
                    if first is not None:
                        ttft.append(first)
                    itl.extend(gaps)
            except Exception as e:  # noqa: BLE001 - every failure counts as an error
                with lock:
                    errors.append(f"client {c} request {j}: {e}")

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.timeout)
    wall = time.time() - t0
    stop.set()
    try:
        metrics = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    except Exception:  # noqa: BLE001 - llama-server has /metrics only with --metrics
        metrics = ""
    try:
        stats = json.load(urllib.request.urlopen(f"http://{addr}/admin/stats", timeout=10))
        batch_union = stats.get("batch_union")
        if budget is None and stats.get("budget_bytes"):
            budget = stats["budget_bytes"] / 2**20  # a budget given as a share ("60%"), as the server resolved it
    except Exception:  # noqa: BLE001 - sift only
        batch_union = None
    srv.terminate()
    try:
        srv.wait(20)
    except subprocess.TimeoutExpired:
        srv.kill()

    for v in (lat, ttft, itl):
        v.sort()
    pct = lambda p, v=lat: v[min(len(v) - 1, int(p * len(v)))] if v else None  # noqa: E731
    peak = max((r for _, r in samples), default=None)
    return {
        "clients": a.clients, "requests_per_client": a.requests, "max_tokens": a.max_tokens,
        "ok": len(lat), "errors": len(errors), "error_samples": errors[:5],
        "wall_s": wall, "requests_per_s": len(lat) / wall if wall else None,
        "tokens_per_s": tokens[0] / wall if wall else None,
        "latency_p50_s": pct(0.50), "latency_p99_s": pct(0.99),
        "ttft_p50_s": pct(0.50, ttft), "ttft_p99_s": pct(0.99, ttft),
        "itl_p50_s": pct(0.50, itl), "itl_p99_s": pct(0.99, itl),
        "latency_mean_s": statistics.mean(lat) if lat else None,
        "rss_peak_mib": peak, "rss_samples": len(samples), "budget_mib": budget,
        "rss_within_budget": None if budget is None or peak is None else peak <= budget,
        "batch_union": batch_union,
        "cgroup_peak_mib": cgroup_peak(), "cgroup_limit_hits": cgroup_hits(),
        "ttft_count": next((float(l.split()[1]) for l in metrics.splitlines()
                            if l.startswith("sift_time_to_first_token_seconds_count")), None),
    }


def cgroup_peak():
    """The cgroup's peak usage (RSS + page cache), MiB, when SIFT_CGROUP put the server in one."""
    if not os.environ.get("SIFT_CGROUP") or not os.path.exists(f"{CGROUP}/memory.max_usage_in_bytes"):
        return None
    return int(open(f"{CGROUP}/memory.max_usage_in_bytes").read()) / 2**20


def cgroup_hits():
    if cgroup_peak() is None:
        return None
    return int(open(f"{CGROUP}/memory.failcnt").read())


def report(a, res, runs):
    print(json.dumps(res, indent=2))
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if any(r["errors"] or r["rss_within_budget"] is False for r in runs):
        sys.exit(1)

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decode speed under a hard memory budget: sift (streaming weight columns from a pack) vs llama.cpp.

What it measures, for one model given as a GGUF (llama.cpp) and as a sift pack (sift), and a list
of budgets in percent of the GGUF file size (default 100,75,60,40,25):

 1. llama.cpp unconstrained: `llama-bench -m GGUF -p 0 -n N -r R -t T -o json` -> tg tok/s.
 2. llama.cpp under each budget: the same command (with -n --llama-n) inside a cgroup-v1 memory
    cgroup whose limit is pct x GGUF size (+ --llama-overhead-mib, default 0), page cache dropped
    first (`sync; echo 3 > /proc/sys/vm/drop_caches`), with --llama-limit-args (default
    `--repack 0`) appended: llama.cpp memory-maps the GGUF, so under the limit the kernel pages its
    weights in from disk every token; its default CPU repacking instead copies the weights into
    anonymous memory (peak RSS 1.7 GiB vs 1.1 GiB on the 1.5B model), which cannot be paged out
    without swap: at 60% on that model it was OOM-killed after 2 minutes of thrashing, while with
    --repack 0 it ran (0.57 tok/s). Unconstrained, --repack 0 was as fast on this machine, but the
    unconstrained baseline keeps llama.cpp's defaults (plus --llama-args). Runs past --timeout are
    killed and reported
    as "<= N/timeout" tok/s (an approximate upper bound: the time spent loading and warming up
    before the timed tokens is not subtracted).
 3. sift for every budget x --policies x --preloads:
    `sift bench -m PACK -p 0 -n N -r R -t T -o json --memory PCT% --cache-policy P --preload K
    [-c CTX if this sift has it] [--sift-args]` -> tg tok/s and the `tiered` object (hit rate,
    bytes read by preload / on demand, reads, mean read size, read bandwidth, preload
    precision/recall, I/O stall and busy time, memory plan). sift's `PCT%` is a percentage of the
    GGUF inside the pack, i.e. of the same GGUF file, so both tools get the same budget in bytes
    (the script checks memory_plan.budget against it).
    With --cgroup-sift (default) each sift run happens inside a cgroup whose limit is the budget
    plus --overhead-mib (default 64), page cache dropped first: this is the memory proof (the run
    completes inside the limit, and memory.max_usage_in_bytes is recorded). The tok/s and
    counters reported come from that same constrained, cold-cache run. If it fails in the cgroup,
    it is recorded as failed and re-run outside the cgroup (cache dropped) to still get numbers.
 4. --rounds K repeats the whole sift grid K times, odd rounds in reverse order, each round
    preceded by one unconstrained llama.cpp run; the tables show medians over rounds (peak memory:
    the maximum over rounds). llama.cpp under limits runs once (round 1), it is slow.

Peak RSS: every child is started directly by this script and reaped with os.wait4(), whose
rusage.ru_maxrss is the peak resident set of that one process (the same syscall GNU time -v
uses, but fresh per run, unlike getrusage(RUSAGE_CHILDREN) which is a max over all children so
far). Linux keeps the larger of the pre-exec and post-exec high-water marks, so the figure has a
floor of this script's own RSS at fork time (~10-20 MiB), far below any model's peak. For cgroup
runs the cgroup's memory.max_usage_in_bytes is recorded too (it also counts page cache charged to
the cgroup, so it is >= RSS). Cgroups are created under this process's own memory cgroup (nested,
use_hierarchy) as sift-membench-<pid>-<n>, only the child is moved into them (from a preexec hook,
before exec), and they are killed/removed afterwards, also on errors and Ctrl-C.

"read MB/token" = (bytes_preload + bytes_ondemand) / tokens the counters cover; sift bench resets
the counters before its tg test, which decodes min(N,16) warm-up tokens then R x N timed tokens,
so the figure includes the cold start.

Outputs (also printed to stdout as markdown): --out DIR (default bench/out/memory-budget-<stem>/)
with results.csv (one row per run, all fields), results.md (tables), hitrate.svg (hit rate vs
cache size as a fraction of the column bytes, one line per policy) and tps.svg (tok/s vs budget).

Example (repo root, as root, after cargo build --release and sift pack):
  python3 bench/memory_budget.py --gguf models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --pack models/qwen2.5-1.5b.sift
Small smoke test (tiny models need budgets over 100% because of fixed overheads):
  python3 bench/memory_budget.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --pack /tmp/smol.sift \\
      --budgets 200,150 --policies lfu --preloads 0,4 -n 8 --llama-n 4 --timeout 60
"""
import argparse
import csv
import datetime
import errno
import html
import json
import math
import os
import pathlib
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIB = 1 << 20
CG_MOUNT = pathlib.Path("/sys/fs/cgroup/memory")


def log(msg):
    print(f"[memory_budget {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- cgroups


class Cgroups:
    """cgroup-v1 memory cgroups for single child processes, removed again on cleanup()."""

    def __init__(self, root=None):
        self.base = pathlib.Path(root) if root else self._own_cgroup()
        self.created = []
        self.seq = 0

    @staticmethod
    def _own_cgroup():
        try:
            for line in open("/proc/self/cgroup"):
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if "memory" in ctrls.split(","):
                    p = CG_MOUNT / path.lstrip("/")
                    if (p / "memory.limit_in_bytes").exists():
                        return p
        except OSError:
            pass
        return CG_MOUNT

    def available(self):
        return (self.base / "memory.limit_in_bytes").exists() and os.access(self.base, os.W_OK)

    def create(self, limit):
        self.seq += 1
        path = self.base / f"sift-membench-{os.getpid()}-{self.seq}"
        os.mkdir(path)
        self.created.append(path)
        (path / "memory.limit_in_bytes").write_text(str(int(limit)))
        memsw = path / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no swapping around the limit (absent without swap accounting)
            try:
                memsw.write_text(str(int(limit)))
            except OSError:
                pass
        return path

    @staticmethod
    def stats(path):
        def num(name):
            try:
                return int((path / name).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return None

        oom_kill = None
        try:
            for line in (path / "memory.oom_control").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    oom_kill = int(v)
        except (OSError, ValueError):
            pass
        return {
            "cgroup_max_usage": num("memory.max_usage_in_bytes"),
            "cgroup_failcnt": num("memory.failcnt"),
            "cgroup_oom_kill": oom_kill,
        }

    def remove(self, path):
        for _ in range(100):
            try:
                pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:  # only children this script started are ever put here
                if pid == os.getpid():
                    try:  # never expected; move ourselves back rather than kill ourselves
                        (self.base / "cgroup.procs").write_text(str(pid))
                    except OSError:
                        pass
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    time.sleep(0.05)
                    continue
            if path in self.created:
                self.created.remove(path)
            return True
        log(f"warning: could not remove cgroup {path}")
        return False

    def cleanup(self):
        for p in list(self.created):
            self.remove(p)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError as e:
        log(f"warning: cannot drop the page cache ({e}); constrained runs may start warm")
        return False


# ---------------------------------------------------------------- running children

CURRENT = None  # the running child's Popen, for cleanup on errors/signals


def kill_child(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the child leads its own session/process group
    except OSError:
        pass


def run_cmd(cmd, env=None, timeout=None, cgroup=None):
    """Runs cmd to completion (or timeout); returns rc, stdout, stderr, wall_s, timed_out, peak_rss."""
    global CURRENT
    procs = str(cgroup / "cgroup.procs") if cgroup else None

    def enter_cgroup():  # in the child, between fork and exec
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=ROOT,
                             start_new_session=True, preexec_fn=enter_cgroup if procs else None)
        CURRENT = p
        timed_out = False
        try:
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if timeout and time.monotonic() - t0 > timeout:
                    timed_out = True
                    kill_child(p)
                    pid, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.05)
        except BaseException:
            kill_child(p)
            try:
                os.wait4(p.pid, 0)
            except ChildProcessError:
                pass
            p.returncode = -9
            raise
        finally:
            CURRENT = None
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "rc": p.returncode,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
            "wall_s": wall,
            "timed_out": timed_out,
            "peak_rss": ru.ru_maxrss * 1024,  # KiB on Linux
        }


def parse_tg(stdout):
    """The tg entry (n_prompt 0, n_gen > 0) of a llama-bench / sift bench JSON array, or None."""
    try:
        arr = json.loads(stdout)
    except ValueError:
        m = re.search(r"\[.*\]", stdout, re.S)
        if not m:
            return None
        try:
            arr = json.loads(m.group(0))
        except ValueError:
            return None
    for e in arr if isinstance(arr, list) else []:
        if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
            return e
    return None


def tail(s, n=400):
    s = s.strip().replace("\n", " | ")
    return s[-n:]


# ---------------------------------------------------------------- helpers


def fnum(x, nd=2, dash="–"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return dash
    return f"{x:.{nd}f}"


def mib(x):
    return None if x is None else x / MIB


def pct_s(p):
    return f"{p:g}%"


def median(vals):
    v = [x for x in vals if x is not None]
    return statistics.median(v) if v else None


# ---------------------------------------------------------------- SVG plots

POLICY_COLORS = {"lfu": "#1f77b4", "lru": "#d62728", "tam": "#2ca02c", "static": "#9467bd", "none": "#8c564b"}
EXTRA_COLORS = ["#ff7f0e", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f"]
DASHES = ["", "7,4", "2,3", "9,3,2,3", "4,2"]
MARKERS = ["circle", "square", "diamond", "tri-up", "circle"]


def policy_color(pol, policies):
    if pol in POLICY_COLORS:
        return POLICY_COLORS[pol]
    extra = [p for p in policies if p not in POLICY_COLORS]
    return EXTRA_COLORS[extra.index(pol) % len(EXTRA_COLORS)] if pol in extra else "#333333"


def nice_ticks(lo, hi, n=6):
    if not (hi > lo):
        lo, hi = (lo - 1, hi + 1) if lo == 0 else (lo * 0.9, hi * 1.1) if lo > 0 else (lo * 1.1, hi * 0.9)
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if span / step <= n:
            break
    start = math.floor(lo / step + 1e-9) * step
    end = math.ceil(hi / step - 1e-9) * step
    k = int(round((end - start) / step))
    ticks = [start + i * step for i in range(k + 1)]
    return start, end, ticks, step


def log_ticks(lo, hi):
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if a == b:
        b += 1
    ticks = [m * 10 ** e for e in range(a, b + 1) for m in (1, 2, 5) if 10 ** a <= m * 10 ** e <= 10 ** b]
    return 10 ** a, 10 ** b, ticks


def tick_label(v, step=None):
    if step is not None and step > 0:
        d = max(0, -math.floor(math.log10(step) + 1e-9))
        if abs(step * 10 ** d - round(step * 10 ** d)) > 1e-6:
            d += 1
        return f"{v:.{d}f}"
    return f"{v:g}"


def marker_svg(kind, x, y, color, hollow, r=4.0):
    fill = "white" if hollow else color
    st = f'fill="{fill}" stroke="{color}" stroke-width="1.5"'
    if kind == "square":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" {st}/>'
    if kind == "diamond":
        r *= 1.25
        return f'<polygon points="{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}" {st}/>'
    if kind == "tri-up":
        r *= 1.2
        return f'<polygon points="{x:.1f},{y - r:.1f} {x + r:.1f},{y + r * 0.8:.1f} {x - r:.1f},{y + r * 0.8:.1f}" {st}/>'
    if kind == "tri-down":
        r *= 1.2
        return f'<polygon points="{x:.1f},{y + r:.1f} {x + r:.1f},{y - r * 0.8:.1f} {x - r:.1f},{y - r * 0.8:.1f}" {st}/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" {st}/>'


def svg_plot(path, title, xlabel, ylabel, series, hlines=(), xrange=None, yrange=None, ylog=False, note=None, xpad=0.0):
    """series: dicts with label, pts [(x, y)], color, dash, marker, hollow, line.
    hlines: dicts with label, y, color, dash."""
    W, H, L, R, T, B = 820, 480, 72, 250, 46, 62
    pw, ph = W - L - R, H - T - B
    xs = [x for s in series for x, _ in s["pts"]]
    ys = [y for s in series for _, y in s["pts"]] + [h["y"] for h in hlines]
    if ylog:
        ys = [y for y in ys if y and y > 0]
    xlo, xhi = xrange or ((min(xs), max(xs)) if xs else (0, 1))
    if xpad and xhi > xlo:
        xlo, xhi = xlo - xpad * (xhi - xlo), xhi + xpad * (xhi - xlo)
    x0, x1, xt, xstep = nice_ticks(xlo, xhi)
    if ylog:
        y0, y1, yt = log_ticks(*((min(ys), max(ys)) if ys else (1, 10)))
        ystep = None
        tr = math.log10
    else:
        y0, y1, yt, ystep = nice_ticks(*(yrange or ((min(0, min(ys)), max(ys) * 1.08) if ys else (0, 1))))
        tr = float

    def sx(x):
        return L + (x - x0) / (x1 - x0) * pw

    def sy(y):
        if ylog and (y is None or y <= 0):
            y = y0
        return T + ph - (tr(y) - tr(y0)) / (tr(y1) - tr(y0)) * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="Helvetica, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2:.1f}" y="24" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    for t in xt:
        X = sx(t)
        o.append(f'<line x1="{X:.1f}" y1="{T}" x2="{X:.1f}" y2="{T + ph}" stroke="#e6e6e6"/>')
        o.append(f'<line x1="{X:.1f}" y1="{T + ph}" x2="{X:.1f}" y2="{T + ph + 5}" stroke="black"/>')
        o.append(f'<text x="{X:.1f}" y="{T + ph + 19}" text-anchor="middle">{tick_label(t, xstep)}</text>')
    for t in yt:
        Y = sy(t)
        o.append(f'<line x1="{L}" y1="{Y:.1f}" x2="{L + pw}" y2="{Y:.1f}" stroke="#e6e6e6"/>')
        o.append(f'<line x1="{L - 5}" y1="{Y:.1f}" x2="{L}" y2="{Y:.1f}" stroke="black"/>')
        o.append(f'<text x="{L - 8}" y="{Y + 4:.1f}" text-anchor="end">{tick_label(t, ystep)}</text>')
    o.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    o.append(f'<text x="{L + pw / 2:.1f}" y="{H - 18}" text-anchor="middle" font-size="13">{html.escape(xlabel)}</text>')
    o.append(f'<text transform="translate(18,{T + ph / 2:.1f}) rotate(-90)" text-anchor="middle" font-size="13">'
             f'{html.escape(ylabel)}</text>')
    o.append(f'<clipPath id="plot"><rect x="{L}" y="{T}" width="{pw}" height="{ph}"/></clipPath>')
    for h in hlines:
        Y = sy(h["y"])
        dash = f' stroke-dasharray="{h["dash"]}"' if h.get("dash") else ""
        o.append(f'<line x1="{L}" y1="{Y:.1f}" x2="{L + pw}" y2="{Y:.1f}" stroke="{h["color"]}" stroke-width="1.5"{dash}/>')
    for s in series:
        pts = sorted(s["pts"])
        if not pts:
            continue
        if s.get("line", True) and len(pts) > 1:
            dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
            pp = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            o.append(f'<polyline points="{pp}" fill="none" stroke="{s["color"]}" stroke-width="2"{dash} clip-path="url(#plot)"/>')
        for x, y in pts:
            o.append(marker_svg(s.get("marker", "circle"), sx(x), sy(y), s["color"], s.get("hollow", False)))
    # legend, right of the plot
    lx, ly = L + pw + 16, T + 8
    entries = [("h", h) for h in hlines] + [("s", s) for s in series if s["pts"]]
    for kind, e in entries:
        dash = f' stroke-dasharray="{e["dash"]}"' if e.get("dash") else ""
        if kind == "h" or e.get("line", True):
            o.append(f'<line x1="{lx}" y1="{ly:.1f}" x2="{lx + 30}" y2="{ly:.1f}" stroke="{e["color"]}" stroke-width="2"{dash}/>')
        if kind == "s":
            o.append(marker_svg(e.get("marker", "circle"), lx + 15, ly, e["color"], e.get("hollow", False)))
        o.append(f'<text x="{lx + 38}" y="{ly + 4:.1f}">{html.escape(e["label"])}</text>')
        ly += 20
    if note:
        lines = [w for para in note.split("\n") for w in textwrap.wrap(para, 40)]
        for i, line in enumerate(lines):
            o.append(f'<text x="{lx}" y="{ly + 12 + 15 * i:.1f}" font-size="10" fill="#555">{html.escape(line)}</text>')
    o.append("</svg>")
    pathlib.Path(path).write_text("\n".join(o) + "\n")


# ---------------------------------------------------------------- main


def main():
    class Fmt(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " (details: the script's docstring)",
                                 formatter_class=Fmt)
    ap.add_argument("--gguf", required=True, help="the model as a GGUF (llama.cpp; budgets are %% of its size)")
    ap.add_argument("--pack", required=True, help="the same model as a sift pack")
    ap.add_argument("--budgets", default="100,75,60,40,25", help="budgets in %% of the GGUF file size (comma list)")
    ap.add_argument("--policies", default="lfu,lru,tam", help="sift --cache-policy values (comma list)")
    ap.add_argument("--preloads", default="0,1,4", help="sift --preload values (comma list)")
    ap.add_argument("-n", "--n-gen", type=int, default=16, help="generated tokens per test (sift, llama.cpp unconstrained)")
    ap.add_argument("-r", "--reps", type=int, default=1, help="repetitions per test (-r of both benches)")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("--llama-n", type=int, default=8, help="generated tokens for llama.cpp under a limit (slow)")
    ap.add_argument("--timeout", type=float, default=300.0, help="wall-clock limit per run in seconds")
    ap.add_argument("--sift-args", default="--sparsity topk --ratio 0.5", help="string appended to sift's args (one flag alone: --sift-args=--flag)")
    ap.add_argument("--llama-args", default="", help="string appended to every llama-bench command")
    ap.add_argument("--llama-limit-args", default="--repack 0",
                    help="string appended to llama-bench under a limit (default --repack 0: see the docstring)")
    ap.add_argument("--ctx", type=int, default=512, help="sift -c (passed only if this sift bench has -c)")
    ap.add_argument("--skip-llama", action="store_true", help="no llama.cpp runs at all")
    ap.add_argument("--skip-llama-constrained", action="store_true", help="no llama.cpp runs under cgroup limits")
    ap.add_argument("--skip-sift", action="store_true", help="no sift runs (llama.cpp only)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the sift grid, alternating order; report medians")
    ap.add_argument("--out", help="output dir (default bench/out/memory-budget-<gguf stem>/)")
    ap.add_argument("--overhead-mib", type=float, default=64.0, help="sift cgroup limit = budget + this")
    ap.add_argument("--llama-overhead-mib", type=float, default=0.0, help="llama.cpp cgroup limit = budget + this")
    ap.add_argument("--cgroup-sift", dest="cgroup_sift", action="store_true", default=True,
                    help="run sift inside a cgroup at budget + overhead (default)")
    ap.add_argument("--no-cgroup-sift", dest="cgroup_sift", action="store_false")
    ap.add_argument("--plot-preload", type=int, help="preload shown in hitrate.svg (default: the fastest)")
    ap.add_argument("--cgroup-root", help="parent cgroup dir (default: this process's memory cgroup)")
    ap.add_argument("--sift", default=str(ROOT / "target/release/sift"))
    ap.add_argument("--llama-bench", default=str(ROOT / ".ref/build/bin/llama-bench"))
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args()

    gguf = pathlib.Path(a.gguf)
    if not gguf.is_file():
        ap.error(f"GGUF '{gguf}' not found")
    if not pathlib.Path(a.pack).is_file() and not a.dry_run:
        ap.error(f"pack '{a.pack}' not found")
    gguf_size = gguf.stat().st_size
    budgets = [float(x) for x in a.budgets.split(",") if x.strip()]
    policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    preloads = [int(x) for x in a.preloads.split(",") if x.strip()]
    out_dir = pathlib.Path(a.out) if a.out else ROOT / "bench/out" / f"memory-budget-{gguf.stem}"
    llama_env = dict(os.environ, LD_LIBRARY_PATH=str(pathlib.Path(a.llama_bench).resolve().parent))
    sift_extra = shlex.split(a.sift_args)
    try:
        sift_help = subprocess.run([a.sift, "bench", "--help"], capture_output=True, text=True).stdout
    except OSError as e:
        sys.exit(f"cannot run {a.sift}: {e}")
    ctx_args = []
    if re.search(r"(^|\s)-c,|--ctx-size\b|--ctx\b", sift_help):
        ctx_args = ["-c", str(a.ctx)]
    else:
        log(f"note: this sift bench has no -c option; not passing -c {a.ctx}")

    def budget_bytes(p):
        return int(gguf_size * p / 100.0)  # what sift computes for "--memory P%"

    def llama_cmd(n, limited=False):
        return ([a.llama_bench, "-m", str(gguf), "-p", "0", "-n", str(n), "-r", str(a.reps), "-t", a.threads, "-o", "json"]
                + shlex.split(a.llama_args) + (shlex.split(a.llama_limit_args) if limited else []))

    def sift_cmd(p, pol, pre):
        return ([a.sift, "bench", "-m", a.pack, "-p", "0", "-n", str(a.n_gen), "-r", str(a.reps), "-t", a.threads,
                 "-o", "json", "--memory", pct_s(p), "--cache-policy", pol, "--preload", str(pre)]
                + ctx_args + sift_extra)

    grid = [] if a.skip_sift else [(p, pol, pre) for p in budgets for pol in policies for pre in preloads]

    if a.dry_run:
        q = shlex.join
        lib = f"LD_LIBRARY_PATH={shlex.quote(llama_env['LD_LIBRARY_PATH'])} "
        print(f"# GGUF {gguf} = {gguf_size} bytes ({gguf_size / MIB:.1f} MiB)")
        if not a.skip_llama:
            print(f"# round 1 llama.cpp unconstrained\n{lib}{q(llama_cmd(a.n_gen))}")
            if not a.skip_llama_constrained:
                for p in budgets:
                    lim = budget_bytes(p) + int(a.llama_overhead_mib * MIB)
                    print(f"# llama.cpp at {pct_s(p)}: drop caches; cgroup limit {lim} bytes; timeout {a.timeout:g}s")
                    print(f"{lib}{q(llama_cmd(a.llama_n, True))}")
        for r in range(a.rounds):
            if r > 0 and not a.skip_llama:
                print(f"# round {r + 1} llama.cpp unconstrained\n{lib}{q(llama_cmd(a.n_gen))}")
            for p, pol, pre in (grid if r % 2 == 0 else grid[::-1]):
                lim = budget_bytes(p) + int(a.overhead_mib * MIB)
                cg = f"cgroup limit {lim} bytes" if a.cgroup_sift else "no cgroup"
                print(f"# round {r + 1} sift {pct_s(p)} {pol} preload {pre}: drop caches; {cg}; timeout {a.timeout:g}s")
                print(q(sift_cmd(p, pol, pre)))
        return 0

    cgs = Cgroups(a.cgroup_root)
    have_cg = cgs.available()
    if not have_cg:
        log(f"warning: no writable cgroup-v1 memory controller at {cgs.base}: "
            "llama.cpp constrained runs skipped, sift runs without a cgroup")

    def on_term(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: ignored by default in background jobs
        signal.signal(sig, on_term)

    rows = []
    interrupted = False
    llama_free = None  # unconstrained llama.cpp tok/s
    llama_lim = {}  # pct -> row
    started = datetime.datetime.now().isoformat(timespec="seconds")

    def run_limited(cmd, env, limit, use_cgroup):
        """drop caches, run cmd (inside a fresh cgroup at `limit` when use_cgroup); merges cgroup stats."""
        drop_caches()
        cg = cgs.create(limit) if use_cgroup else None
        try:
            res = run_cmd(cmd, env=env, timeout=a.timeout, cgroup=cg)
            res.update(Cgroups.stats(cg) if cg else {"cgroup_max_usage": None, "cgroup_failcnt": None,
                                                     "cgroup_oom_kill": None})
        finally:
            if cg:
                cgs.remove(cg)
        res["cgroup_limit"] = limit if use_cgroup else None
        return res

    def status_of(res):
        if res["timed_out"]:
            return "timeout"
        if res["rc"] == 0:
            return "ok"
        if res.get("cgroup_oom_kill"):
            return "oom"
        return f"rc={res['rc']}"

    try:
        # 1. llama.cpp unconstrained (once per round, before that round's sift grid; median reported)
        def llama_free_run(rnd):
            if a.skip_llama:
                return
            log(f"llama.cpp unconstrained: tg{a.n_gen} x{a.reps} (round {rnd})")
            res = run_cmd(llama_cmd(a.n_gen), env=llama_env, timeout=a.timeout)
            tg = parse_tg(res["stdout"]) if res["rc"] == 0 else None
            v = tg["avg_ts"] if tg else None
            rows.append({"tool": "llama.cpp", "kind": "unconstrained", "round": rnd, "n_gen": a.n_gen, "reps": a.reps,
                         "status": status_of(res) if tg or res["rc"] or res["timed_out"] else "no-json", "avg_ts": v,
                         "stddev_ts": tg.get("stddev_ts") if tg else None, "timed_out": res["timed_out"],
                         "wall_s": res["wall_s"], "peak_rss": res["peak_rss"], "exit_code": res["rc"],
                         "cmd": shlex.join(llama_cmd(a.n_gen))})
            if v is None:
                log(f"  llama-bench failed ({status_of(res)}): {tail(res['stderr'])}")
            else:
                log(f"  {v:.2f} tok/s, peak RSS {res['peak_rss'] / MIB:.0f} MiB")

        llama_free_run(1)

        # 2. llama.cpp under each budget
        if not a.skip_llama and not a.skip_llama_constrained and have_cg:
            for p in budgets:
                b = budget_bytes(p)
                lim = b + int(a.llama_overhead_mib * MIB)
                log(f"llama.cpp at {pct_s(p)} = {b / MIB:.0f} MiB (cgroup limit {lim / MIB:.0f} MiB): "
                    f"tg{a.llama_n}, timeout {a.timeout:g} s")
                cmd = llama_cmd(a.llama_n, True)
                res = run_limited(cmd, llama_env, lim, True)
                st = status_of(res)
                tg = parse_tg(res["stdout"]) if st == "ok" else None
                if st == "ok" and not tg:
                    st = "no-json"
                row = {"tool": "llama.cpp", "kind": "constrained", "round": 1, "budget_pct": p, "budget_bytes": b,
                       "n_gen": a.llama_n, "reps": a.reps, "status": st, "avg_ts": tg["avg_ts"] if tg else None,
                       "stddev_ts": tg.get("stddev_ts") if tg else None,
                       "tps_upper_bound": a.llama_n / a.timeout if st == "timeout" else None,
                       "timed_out": res["timed_out"], "wall_s": res["wall_s"], "peak_rss": res["peak_rss"],
                       "exit_code": res["rc"], "cgroup_limit": lim, "cgroup_max_usage": res["cgroup_max_usage"],
                       "cgroup_failcnt": res["cgroup_failcnt"], "cgroup_oom_kill": res["cgroup_oom_kill"],
                       "cmd": shlex.join(cmd)}
                rows.append(row)
                llama_lim[p] = row
                if tg:
                    log(f"  {tg['avg_ts']:.3f} tok/s in {res['wall_s']:.0f} s, cgroup peak "
                        f"{(res['cgroup_max_usage'] or 0) / MIB:.0f} MiB")
                elif st == "timeout":
                    log(f"  timed out after {a.timeout:g} s: <= {a.llama_n / a.timeout:.3f} tok/s")
                else:
                    log(f"  failed ({st}): {tail(res['stderr'])}")

        # 3./4. the sift grid
        use_cg = have_cg and a.cgroup_sift
        total = len(grid) * a.rounds
        i = 0
        for r in range(a.rounds):
            if r > 0:
                llama_free_run(r + 1)
            for p, pol, pre in (grid if r % 2 == 0 else grid[::-1]):
                i += 1
                b = budget_bytes(p)
                lim = b + int(a.overhead_mib * MIB)
                cmd = sift_cmd(p, pol, pre)
                res = run_limited(cmd, None, lim, use_cg)
                st = status_of(res)
                row = {"tool": "sift", "kind": "constrained", "round": r + 1, "budget_pct": p, "budget_bytes": b,
                       "policy": pol, "preload": pre, "n_gen": a.n_gen, "reps": a.reps, "in_cgroup": use_cg,
                       "cgroup_limit": lim if use_cg else None, "cgroup_ok": (st == "ok") if use_cg else None,
                       "cgroup_max_usage": res["cgroup_max_usage"], "cgroup_failcnt": res["cgroup_failcnt"],
                       "cgroup_oom_kill": res["cgroup_oom_kill"], "cmd": shlex.join(cmd)}
                if st != "ok" and use_cg:
                    log(f"  sift failed in the cgroup ({st}): {tail(res['stderr'])}; re-running without a cgroup")
                    row["cgroup_status"] = st
                    row["in_cgroup"] = False
                    res = run_limited(cmd, None, lim, False)
                    st = status_of(res)
                tg = parse_tg(res["stdout"]) if st == "ok" else None
                if st == "ok" and not tg:
                    st = "no-json"
                row.update({"status": st, "timed_out": res["timed_out"], "exit_code": res["rc"],
                            "wall_s": res["wall_s"], "peak_rss": res["peak_rss"],
                            "tps_upper_bound": a.n_gen / a.timeout if st == "timeout" else None})
                if tg:
                    row["avg_ts"] = tg["avg_ts"]
                    row["stddev_ts"] = tg.get("stddev_ts")
                    t = tg.get("tiered") or {}
                    for k in ("hit_rate", "bytes_preload", "bytes_ondemand", "bytes_prefill", "reads", "mean_read_bytes",
                              "read_bandwidth", "preload_precision", "preload_recall", "io_stall_ns", "io_busy_ns",
                              "io", "preload_interleaved", "memory_budget"):
                        row[k] = t.get(k)
                    for k, v in (t.get("memory_plan") or {}).items():
                        row[f"plan_{k}"] = v
                    toks = min(a.n_gen, 16) + a.reps * a.n_gen  # warm-up + timed tokens (sift bench_tg)
                    row["tokens_counted"] = toks
                    if row.get("bytes_preload") is not None and row.get("bytes_ondemand") is not None:
                        row["read_mb_per_token"] = (row["bytes_preload"] + row["bytes_ondemand"]) / toks / 1e6
                    if row.get("io_stall_ns") is not None:
                        row["stall_ms_per_token"] = row["io_stall_ns"] / toks / 1e6
                    pb = row.get("plan_budget") or row.get("memory_budget")
                    if pb is not None and abs(pb - b) > MIB:
                        log(f"  warning: sift's budget {pb} bytes differs from {b} (pack made from another GGUF?)")
                    if not t:
                        log("  warning: no 'tiered' object in sift's JSON")
                row["rss_minus_budget_mib"] = (res["peak_rss"] - b) / MIB
                row["rss_within_budget_overhead"] = res["peak_rss"] <= lim
                rows.append(row)
                msg = (f"[{i}/{total}] sift {pct_s(p)} ({b / MIB:.0f} MiB) {pol} preload {pre} round {r + 1}: ")
                if tg:
                    msg += (f"{row['avg_ts']:.2f} tok/s, hit {fnum(row.get('hit_rate'), 3)}, "
                            f"cache {fnum(row.get('plan_cache_fraction'), 3)} of columns, "
                            f"{fnum(row.get('read_mb_per_token'), 1)} MB/tok, peak RSS {res['peak_rss'] / MIB:.0f} MiB")
                else:
                    msg += f"failed ({st}): {tail(res['stderr'])}"
                if use_cg:
                    msg += (f", cgroup {'ok' if row['cgroup_ok'] else 'FAILED'} peak "
                            f"{(row['cgroup_max_usage'] or 0) / MIB:.0f}/{lim / MIB:.0f} MiB")
                log(msg)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: cleaning up and writing what was measured")
    finally:
        if CURRENT is not None:
            kill_child(CURRENT)
        if have_cg:
            cgs.cleanup()
    llama_free = median(r["avg_ts"] for r in rows if r["tool"] == "llama.cpp" and r["kind"] == "unconstrained")

    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"gguf": str(gguf), "gguf_size": gguf_size, "pack": a.pack, "started": started, "a": a,
            "ctx_args": ctx_args, "cgroups": have_cg, "interrupted": interrupted}
    write_csv(out_dir / "results.csv", rows)
    md = report(rows, meta, llama_free, llama_lim, budgets, policies, preloads, out_dir)
    (out_dir / "results.md").write_text(md)
    print(md)
    log(f"wrote {out_dir}/results.csv, results.md, {'hitrate.svg, ' if any(r['tool'] == 'sift' for r in rows) else ''}tps.svg")
    return 130 if interrupted else 0


CSV_FIRST = ["tool", "kind", "round", "budget_pct", "budget_bytes", "policy", "preload", "n_gen", "reps", "status",
             "avg_ts", "stddev_ts", "tps_upper_bound", "timed_out", "exit_code", "wall_s", "peak_rss",
             "rss_minus_budget_mib", "rss_within_budget_overhead", "in_cgroup", "cgroup_status", "cgroup_ok",
             "cgroup_limit", "cgroup_max_usage", "cgroup_failcnt", "cgroup_oom_kill", "hit_rate", "tokens_counted",
             "read_mb_per_token", "stall_ms_per_token", "bytes_preload", "bytes_ondemand", "bytes_prefill", "reads",
             "mean_read_bytes", "read_bandwidth", "preload_precision", "preload_recall", "io_stall_ns", "io_busy_ns",
             "io", "preload_interleaved", "memory_budget"]


def write_csv(path, rows):
    keys = list(CSV_FIRST)
    extra = sorted({k for r in rows for k in r} - set(keys) - {"cmd"})
    keys += extra + ["cmd"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})


def report(rows, meta, llama_free, llama_lim, budgets, policies, preloads, out_dir):
    a = meta["a"]
    sift = [r for r in rows if r["tool"] == "sift"]
    configs = [(pol, pre) for pol in policies for pre in preloads]

    # medians over rounds per (budget, policy, preload); memory: max over rounds
    agg = {}
    for p in budgets:
        for pol, pre in configs:
            rs = [r for r in sift if r["budget_pct"] == p and r["policy"] == pol and r["preload"] == pre]
            if not rs:
                continue
            m = {k: median(r.get(k) for r in rs) for k in
                 ("avg_ts", "hit_rate", "plan_cache_fraction", "read_mb_per_token", "preload_precision",
                  "preload_recall", "stall_ms_per_token", "read_bandwidth", "mean_read_bytes", "plan_cache")}
            m["peak_rss"] = max((r["peak_rss"] for r in rs if r.get("peak_rss") is not None), default=None)
            m["cgroup_max_usage"] = max((r["cgroup_max_usage"] for r in rs if r.get("cgroup_max_usage") is not None),
                                        default=None)
            m["cgroup_limit"] = rs[0].get("cgroup_limit")
            oks = [r.get("cgroup_ok") for r in rs if r.get("cgroup_ok") is not None]
            m["cgroup_ok"] = None if not oks else f"{sum(oks)}/{len(oks)}"
            m["cgroup_ok_all"] = None if not oks else all(oks)
            m["n"] = sum(1 for r in rs if r.get("avg_ts") is not None)
            m["status"] = ",".join(sorted({r["status"] for r in rs}))
            m["budget_bytes"] = rs[0]["budget_bytes"]
            agg[(p, pol, pre)] = m

    def llama_at(p):
        """(text, value, kind) for llama.cpp at budget p; kind in ok/bound/fail/None."""
        r = llama_lim.get(p)
        if r is None:
            return "–", None, None
        if r["status"] == "ok":
            return f"{r['avg_ts']:.3f}", r["avg_ts"], "ok"
        if r["status"] == "timeout":
            return f"≤{r['tps_upper_bound']:.3f} (timeout)", r["tps_upper_bound"], "bound"
        return f"failed ({r['status']})", None, "fail"

    def cfg_name(pol, pre):
        return f"{pol}/p{pre}"

    L = []
    L.append(f"# Memory-budget decode benchmark: {pathlib.Path(meta['gguf']).stem}\n")
    L.append(f"- GGUF `{meta['gguf']}` ({meta['gguf_size'] / MIB:.1f} MiB; budgets are % of this), pack `{meta['pack']}`")
    extra_args = " ".join([a.sift_args] + meta["ctx_args"]).strip()
    L.append(f"- started {meta['started']}, {os.cpu_count()} CPUs, threads {a.threads}; sift: tg{a.n_gen} x{a.reps} reps, "
             f"{a.rounds} round(s), extra args `{extra_args}`")
    la = a.llama_args.strip() or "defaults"
    lla = (a.llama_args + " " + a.llama_limit_args).strip() or "defaults"
    L.append(f"- llama.cpp: unconstrained tg{a.n_gen} x{a.reps} (`{la}`); constrained tg{a.llama_n} x{a.reps} "
             f"(`{lla}`), timeout {a.timeout:g} s, "
             f"cgroup limit = budget + {a.llama_overhead_mib:g} MiB")
    cg_sift = "each run inside a cgroup at budget + %g MiB" % a.overhead_mib if (meta["cgroups"] and a.cgroup_sift) \
        else "no cgroup"
    L.append(f"- sift: `--memory PCT%`, {cg_sift}; page cache dropped before every constrained run")
    L.append("- peak RSS: ru_maxrss of the child from os.wait4 (per process); cgroup peak: memory.max_usage_in_bytes "
             "(includes page cache charged to the cgroup)")
    if meta["interrupted"]:
        L.append("- **interrupted: partial results**")
    L.append("")
    free = [r for r in rows if r["tool"] == "llama.cpp" and r["kind"] == "unconstrained"]
    if free:
        vals = [r["avg_ts"] for r in free if r["avg_ts"] is not None]
        bad = [r["status"] for r in free if r["status"] != "ok"]
        rng = f", {min(vals):.2f}..{max(vals):.2f}" if len(vals) > 1 else ""
        L.append(f"llama.cpp unconstrained: **{fnum(llama_free, 2)} tok/s** (tg{a.n_gen}; median of {len(vals)} "
                 f"run(s), one per round{rng}; peak RSS {fnum(mib(max(r['peak_rss'] for r in free)), 0)} MiB"
                 + (f"; failed: {', '.join(bad)}" if bad else "") + ")\n")

    if llama_lim:
        L.append("## llama.cpp under a cgroup limit\n")
        L.append("| budget | limit MiB | tok/s | status | wall s | cgroup peak MiB | peak RSS MiB |")
        L.append("|---:|---:|---:|---|---:|---:|---:|")
        for p in budgets:
            r = llama_lim.get(p)
            if r:
                L.append(f"| {pct_s(p)} | {r['cgroup_limit'] / MIB:.0f} | {llama_at(p)[0]} | {r['status']} | "
                         f"{r['wall_s']:.1f} | {fnum(mib(r['cgroup_max_usage']), 0)} | {fnum(mib(r['peak_rss']), 0)} |")
        L.append("")

    if agg:
        present = [c for c in configs if any((p, *c) in agg for p in budgets)]
        hdr = "| budget | MiB | llama.cpp@limit | " + " | ".join(cfg_name(*c) for c in present) + " |"
        sep = "|---:|---:|---:|" + "---:|" * len(present)
        L.append(f"## sift tok/s (median of {a.rounds} round(s)); config = policy/preload\n")
        L.append(hdr)
        L.append(sep)
        for p in budgets:
            cells = [fnum(agg[(p, *c)]["avg_ts"], 2) if (p, *c) in agg else "–" for c in present]
            L.append(f"| {pct_s(p)} | {budget_bytes_of(meta, p) / MIB:.0f} | {llama_at(p)[0]} | " + " | ".join(cells) + " |")
        L.append("")
        if llama_free:
            L.append("## sift / llama.cpp unconstrained\n")
            L.append("| budget | " + " | ".join(cfg_name(*c) for c in present) + " |")
            L.append("|---:|" + "---:|" * len(present))
            for p in budgets:
                cells = []
                for c in present:
                    v = agg.get((p, *c), {}).get("avg_ts")
                    cells.append("–" if v is None else f"{v / llama_free:.2f}x")
                L.append(f"| {pct_s(p)} | " + " | ".join(cells) + " |")
            L.append("")
        if llama_lim:
            L.append("## sift / llama.cpp under the same limit (≥: llama.cpp timed out, its tok/s is a bound)\n")
            L.append("| budget | " + " | ".join(cfg_name(*c) for c in present) + " |")
            L.append("|---:|" + "---:|" * len(present))
            for p in budgets:
                _, lv, lk = llama_at(p)
                cells = []
                for c in present:
                    v = agg.get((p, *c), {}).get("avg_ts")
                    if v is None or lk is None:
                        cells.append("–")
                    elif lk == "fail":
                        cells.append("llama.cpp failed")
                    elif lk == "bound":
                        cells.append(f"≥{v / lv:.1f}x")
                    else:
                        cells.append(f"{v / lv:.1f}x")
                L.append(f"| {pct_s(p)} | " + " | ".join(cells) + " |")
            L.append("")

        L.append("## sift details (medians over rounds; memory columns: max over rounds)\n")
        L.append(f"read MB/tok and stall ms/tok divide sift's tg counters by the {min(a.n_gen, 16) + a.reps * a.n_gen} "
                 f"tokens they cover (min(n,16) warm-up from a cold cache + {a.reps} x {a.n_gen} timed). "
                 "Preload P: preloaded parts later used / preloaded; R: cache misses the preload buffer held / misses.\n")
        L.append("| budget | policy | preload | tok/s | hit rate | cache frac | read MB/tok | preload P | preload R | "
                 "stall ms/tok | read MB/s | budget MiB | peak RSS MiB | RSS/budget | cgroup peak MiB | cgroup limit MiB | "
                 "in cgroup ok | status |")
        L.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for p in budgets:
            for pol, pre in configs:
                m = agg.get((p, pol, pre))
                if not m:
                    continue
                rb = m["peak_rss"] / m["budget_bytes"] if m["peak_rss"] and m["budget_bytes"] else None
                L.append(f"| {pct_s(p)} | {pol} | {pre} | {fnum(m['avg_ts'], 2)} | {fnum(m['hit_rate'], 3)} | "
                         f"{fnum(m['plan_cache_fraction'], 3)} | {fnum(m['read_mb_per_token'], 2)} | "
                         f"{fnum(m['preload_precision'], 3)} | {fnum(m['preload_recall'], 3)} | "
                         f"{fnum(m['stall_ms_per_token'], 2)} | {fnum(None if m['read_bandwidth'] is None else m['read_bandwidth'] / 1e6, 0)} | "
                         f"{m['budget_bytes'] / MIB:.0f} | {fnum(mib(m['peak_rss']), 1)} | {fnum(rb, 2)} | "
                         f"{fnum(mib(m['cgroup_max_usage']), 1)} | {fnum(mib(m['cgroup_limit']), 0)} | "
                         f"{m['cgroup_ok'] or '–'} | {m['status']} |")
        L.append("")
        over = [(k, m) for k, m in agg.items() if m["peak_rss"] and m["cgroup_limit"] and m["peak_rss"] > m["cgroup_limit"]]
        fails = [k for k, m in agg.items() if m["cgroup_ok_all"] is False]
        if any(m["cgroup_ok_all"] is not None for m in agg.values()):
            L.append(f"Memory proof: {len(agg) - len(fails)}/{len(agg)} configs completed inside their cgroup in every "
                     f"round; {len(over)} had peak RSS above budget + {a.overhead_mib:g} MiB.\n")

    # plots
    plot_pre = a.plot_preload
    if plot_pre is None and agg:
        def score(pre):
            v = [m["avg_ts"] for (p, pol, pr), m in agg.items() if pr == pre and m["avg_ts"] is not None]
            return (statistics.mean(v) if v else -1, sum(1 for k in agg if k[2] == pre))
        plot_pre = max(preloads, key=score)
    hs = []
    for pol in policies if agg else []:
        pts = [(m["plan_cache_fraction"], m["hit_rate"]) for (p, po, pr), m in agg.items()
               if po == pol and pr == plot_pre and m["plan_cache_fraction"] is not None and m["hit_rate"] is not None]
        hs.append({"label": pol, "pts": pts, "color": policy_color(pol, policies), "marker": "circle"})
    xs = [x for s in hs for x, _ in s["pts"]]
    if not agg and (out_dir / "hitrate.svg").exists():
        (out_dir / "hitrate.svg").unlink()  # stale, from an earlier run
    if agg:
        svg_plot(out_dir / "hitrate.svg", f"Column-cache hit rate, preload {plot_pre} ({pathlib.Path(meta['gguf']).stem})",
                 "cache size / column bytes (memory_plan.cache_fraction)", "hit rate", hs,
                 xrange=(0, max(1.0, max(xs) if xs else 1.0)), yrange=(0, 1),
                 note=f"sift {a.sift_args}\ntg{a.n_gen} x{a.reps}, medians of {a.rounds} round(s)")
    ts = []
    for j, pre in enumerate(preloads):
        for pol in policies:
            pts = [(p, m["avg_ts"]) for (p, po, pr), m in agg.items() if po == pol and pr == pre and m["avg_ts"]]
            ts.append({"label": f"sift {pol} preload {pre}", "pts": pts, "color": policy_color(pol, policies),
                       "dash": DASHES[j % len(DASHES)], "marker": MARKERS[j % len(MARKERS)]})
    ok_pts = [(p, v) for p in budgets for t, v, k in [llama_at(p)] if k == "ok" and v]
    bound_pts = [(p, v) for p in budgets for t, v, k in [llama_at(p)] if k == "bound" and v]
    ts.append({"label": "llama.cpp under limit", "pts": ok_pts, "color": "black", "marker": "square", "line": False})
    ts.append({"label": "llama.cpp timed out (≤ n/T)", "pts": bound_pts, "color": "black", "marker": "tri-down",
               "hollow": True, "line": False})
    hl = [{"label": "llama.cpp unconstrained", "y": llama_free, "color": "black", "dash": "6,4"}] if llama_free else []
    yv = [y for s in ts for _, y in s["pts"] if y] + ([llama_free] if llama_free else [])
    ylog = bool(yv) and max(yv) / min(yv) > 20
    svg_plot(out_dir / "tps.svg", f"Decode speed under a memory budget ({pathlib.Path(meta['gguf']).stem})",
             "budget (% of GGUF size)", "tok/s" + (" (log scale)" if ylog else ""), ts, hlines=hl, ylog=ylog, xpad=0.05,
             xrange=(min(budgets) if budgets else 0, max(budgets) if budgets else 100),
             note=f"sift {a.sift_args}; cgroup limit = budget + {a.overhead_mib:g} MiB\n"
                  f"llama.cpp constrained: tg{a.llama_n}, timeout {a.timeout:g} s")
    L.append(f"Plots: `hitrate.svg` (preload {plot_pre}), `tps.svg`." if agg else "Plot: `tps.svg` (no sift runs).")
    return "\n".join(L) + "\n"


def budget_bytes_of(meta, p):
    return int(meta["gguf_size"] * p / 100.0)


if __name__ == "__main__":
    sys.exit(main())

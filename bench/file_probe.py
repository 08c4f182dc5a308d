#!/usr/bin/env python3
# Damaged side files: every file sift reads besides its command line (calibration JSON, trace,
# device profile, sparse-prefill predictor, LoRA GGUF and its optimizer state, the .sift pack and
# its .verified record, the model GGUF, the budget file) made once from the small model, then
# damaged (empty, truncated, bytes flipped, garbage appended, another kind of file, a directory,
# missing, and crafted fields: counts, lengths, offsets, shapes, NaNs) and handed to the
# commands that read it. A damaged file must be refused (exit 1 with a message) or used
# correctly; never a panic, a signal, a hang. Classes: OK-refused (rc 1 with a message),
# OK-accepted (rc 0), PANIC, SIGNAL, HANG (TIMEOUT s), REFUSED-NO-MESSAGE, RCn. Prints the runs
# that are not OK, the empty / truncated / foreign / directory / missing files accepted (SILENT:
# without a word), one line per crafted file some command accepted (to review: many crafted
# values are legitimate), then a summary. Run from the repository root (about 7 min on 2 cores):
#   python3 bench/file_probe.py [KIND...]   (SIFT= another binary)
# Kinds: calib trace profile predictor lora adam pack verified gguf budget. Everything it writes
# is under /tmp/fileprobe (the good files in good/, every run in results.jsonl); the models are
# only read (plans and sparse runs use the pack and plans get a trace, so nothing is built or
# probed beside the GGUF or the pack).
import json, os, random, re, shutil, signal, struct, subprocess, sys, time, zlib

S = os.environ.get("SIFT", "target/release/sift")
M = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
P = "models/SmolLM2-135M-Instruct.Q4_1.sift"
TXT = "tests/fixtures/wiki.test.head16k.raw"
W = "/tmp/fileprobe"  # the only folder this probe writes to
GOOD, MUT, OUT = W + "/good", W + "/mut", W + "/out"
TIMEOUT = 60
SEED = 22

def g(name):
    return f"{GOOD}/{name}"

# ---- the good files ----------------------------------------------------------------------

SETUP = [  # (file, command that makes it)
    ("c.json", [S, "calibrate", M, "-f", TXT, "-o", g("c.json"), "--tokens", "512", "--greedy-tokens", "64",
                "--target", "0.5", "--clusters", "4", "--cluster-passages", "8", "--cluster-len", "16", "--force", "-t", "1"]),
    ("t.trace", [S, "trace", "-m", M, "-p", "Hello", "-n", "4", "-o", g("t.trace"), "-t", "1"]),
    ("p.toml", [S, "probe", "--quick", "-o", g("p.toml"), "--force", "-t", "1"]),
    ("pred.prefill", [S, "train", "prefill", "-m", M, "-f", TXT, "--steps", "1", "--blocks", "2", "--compensator-steps", "1",
                      "--seq-blocks", "2", "-o", g("pred.prefill"), "--force", "-t", "1"]),
    ("l.lora.gguf", [S, "train", "distill", "-m", M, "-f", TXT, "--steps", "1", "--sparsity", "topk", "--ratio", "0.5",
                     "--tokens", "64", "--seq", "32", "-o", g("l.lora.gguf"), "--no-fuse", "--force", "-t", "1"]),
]

def setup():
    for d in (GOOD, MUT, OUT):
        os.makedirs(d, exist_ok=True)
    for name, cmd in SETUP:
        if os.path.exists(g(name)):
            continue
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            sys.exit(f"setup: {' '.join(cmd)} failed (rc {r.returncode}): {r.stderr.strip()[-300:]}")
        print(f"setup: made {g(name)} in {time.time() - t:.1f} s", flush=True)
    if not os.path.exists(g("prompt.txt")):  # ~600 tokens: the first and last 128-token blocks stay dense
        with open(TXT, encoding="utf-8", errors="ignore") as f:
            text = f.read(2300)
        with open(g("prompt.txt"), "w") as f:
            f.write(text)
    with open(g("b.txt"), "w") as f:
        f.write("300M\n")

# ---- running and judging ---------------------------------------------------------------

results = []
counts = {}
crafted_accepts = {}  # (kind, mutation) -> consumers that ran a crafted file: printed once per file
t0 = time.time()

def run(args, timeout=TIMEOUT):
    """(rc, stderr, hung): the command in its own process group, killed whole on a timeout."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, err.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return p.returncode, err.decode("utf-8", "replace"), True

def last_line(err):
    lines = [l for l in err.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    for l in lines:  # a panic's message, not the backtrace hint after it
        if "panicked" in l:
            i = lines.index(l)
            return " | ".join(lines[i:i + 2])[:240]
    return lines[-1][:240]

WARNED = re.compile(r"warn|ignor|error|invalid|unpars|cannot|can't|refus|not a |skipp", re.I)
SUSPECT = {"empty", "trunc", "foreign", "dir", "missing"}

def judge(kind, mut, cat, cons, args, rc, err, hung, dt, expect="refuse", missing_ok=False):
    if hung:
        cls = "HANG"
    elif "panicked" in err or rc == 101:
        cls = "PANIC"
    elif rc is not None and rc < 0:
        cls = "SIGNAL"
    elif rc == 1:
        cls = "OK-refused" if err.strip() else "REFUSED-NO-MESSAGE"
    elif rc == 0:
        cls = "OK-accepted"
    else:
        cls = f"RC{rc}"
    counts[cls] = counts.get(cls, 0) + 1
    rec = {"kind": kind, "mutation": mut, "cat": cat, "consumer": cons, "cmd": " ".join(args), "rc": rc,
           "class": cls, "last": last_line(err), "secs": round(dt, 2)}
    results.append(rec)
    show = cls not in ("OK-refused", "OK-accepted")
    tag = cls
    if cls == "OK-refused" and expect == "cache" and cat != "good":
        show, tag = True, "REFUSED(a cache record: expected a re-check)"
    if cls == "OK-accepted":
        if cat == "good" or expect == "cache":
            pass
        elif expect == "warn":  # the budget file: rc 0 is right, silence is not (unless by design)
            if cat not in ("empty", "missing", "good-value") and "budget file" not in err:
                show, tag = True, "ACCEPT-SILENT"
        elif cat in SUSPECT:
            warned = WARNED.search(err)
            show, tag = not (warned and cat == "missing" and missing_ok), "ACCEPT-WARNED" if warned else "ACCEPT-SILENT"
        elif cat == "crafted":
            crafted_accepts.setdefault((kind, mut), []).append(cons)
    if cat == "good" and cls != "OK-accepted":
        show, tag = True, f"BASELINE-FAILED {cls}"
    if show:
        if tag == "ACCEPT-SILENT":
            counts["suspicious-accept"] = counts.get("suspicious-accept", 0) + 1
        print(f"{kind} [{mut}] {cons}: {tag} rc={rc} :: {rec['last']}\n    $ {rec['cmd']}", flush=True)
    return rec

# ---- making damaged files ------------------------------------------------------------------

def rm(path):
    if os.path.islink(path) or os.path.isfile(path) or (os.path.exists(path) and not os.path.isdir(path)):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)

def fresh_dir(kind):
    d = f"{MUT}/{kind}"
    rm(d)
    os.makedirs(d)
    return d

def pwrite(path, off, data):
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)

def flip_at(o, x):
    """XORs the byte at o with x, in place."""
    def fn(p):
        with open(p, "r+b") as f:
            f.seek(o)
            b = f.read(1)
            f.seek(o)
            f.write(bytes([b[0] ^ x]))
    return fn

def copy_then(src, fn=None):
    def make(dst):
        shutil.copyfile(src, dst)
        if fn:
            fn(dst)
    return make

def write_bytes(data):
    def make(dst):
        with open(dst, "wb") as f:
            f.write(data)
    return make

def generic(src, rng, head_flips, body_flips, head=4096, foreign=(), body_from=None):
    """The damage every file gets: (label, category, make(dst))."""
    n = os.path.getsize(src)
    muts = [("empty", "empty", write_bytes(b""))]
    for cut in (1, 8, 64):
        if cut < n:
            muts.append((f"trunc@{cut}", "trunc", copy_then(src, lambda p, c=cut: os.truncate(p, c))))
    for pct in (25, 50, 75):
        muts.append((f"trunc@{pct}%", "trunc", copy_then(src, lambda p, c=n * pct // 100: os.truncate(p, c))))
    with open(src, "rb") as f:
        f.seek(max(0, n - 64))
        tail = f.read()
    short = n - (len(tail) - len(tail.rstrip(b" \t\r\n"))) - 1  # one byte of content short
    muts.append(("trunc@-1", "trunc", copy_then(src, lambda p: os.truncate(p, short))))
    offs = [rng.randrange(min(head, n)) for _ in range(head_flips)]
    lo = body_from if body_from is not None else min(head, n - 1)
    offs += [rng.randrange(lo, n) for _ in range(body_flips)]
    for o in offs:
        x = rng.randrange(1, 256)
        muts.append((f"flip@{o}^{x:#04x}", "flip", copy_then(src, flip_at(o, x))))
    junk = bytes(rng.randrange(256) for _ in range(4096))
    def append(p):
        with open(p, "ab") as f:
            f.write(junk)
    muts.append(("append4KiB", "append", copy_then(src, append)))
    for other in foreign:
        cat = "foreign-model" if other in (M, P) and src in (M, P) else "foreign"
        muts.append((f"foreign:{os.path.basename(other)}", cat, copy_then(other)))
    muts.append(("directory", "dir", lambda dst: os.mkdir(dst)))
    # Not regular files: a FIFO with no writer (a plain open blocks forever) and a device that
    # never ends (a plain read takes memory until it runs out); both through the file's own name.
    muts.append(("fifo", "dir", lambda dst: os.mkfifo(dst)))
    muts.append(("->/dev/zero", "dir", lambda dst: os.symlink("/dev/zero", dst)))
    muts.append(("missing", "missing", lambda dst: None))
    return muts

# ---- crafted fields -------------------------------------------------------------------------

def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)

def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)

GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

def gguf_layout(path):
    """Offsets of a GGUF's header fields: {kv: {key: {...}}, tensors: [...], n_tensors, n_kv}."""
    with open(path, "rb") as f:
        b = f.read(8 << 20)
    assert b[:4] == b"GGUF"
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    pos, kv = 24, {}
    def skip_val(t, pos):
        if t == 8:
            (l,) = struct.unpack_from("<Q", b, pos)
            return pos + 8 + l
        return pos + GGUF_SCALAR[t]
    for _ in range(n_kv):
        klen_off = pos
        (kl,) = struct.unpack_from("<Q", b, pos)
        key = b[pos + 8:pos + 8 + kl].decode()
        pos += 8 + kl
        (t,) = struct.unpack_from("<I", b, pos)
        e = {"klen": klen_off, "type_off": pos, "type": t, "val": pos + 4}
        pos += 4
        if t == 9:
            et, cnt = struct.unpack_from("<IQ", b, pos)
            e.update(elem_type=et, elem_type_off=pos, count=cnt, count_off=pos + 4, first=pos + 12)
            pos += 12
            for _ in range(cnt):
                pos = skip_val(et, pos)
        else:
            pos = skip_val(t, pos)
        kv[key] = e
    tensors = []
    for _ in range(n_t):
        (nl,) = struct.unpack_from("<Q", b, pos)
        e = {"name_len": pos, "name": b[pos + 8:pos + 8 + nl].decode(), "name_off": pos + 8}
        pos += 8 + nl
        (nd,) = struct.unpack_from("<I", b, pos)
        e.update(n_dims_off=pos, n_dims=nd, dims_off=pos + 4,
                 dims=list(struct.unpack_from(f"<{nd}Q", b, pos + 4)))
        pos += 4 + 8 * nd
        e["type_off"] = pos
        (e["type"],) = struct.unpack_from("<I", b, pos)
        e["offset_off"] = pos + 4
        (e["offset"],) = struct.unpack_from("<Q", b, pos + 4)
        pos += 12
        tensors.append(e)
    data = (pos + 31) // 32 * 32
    return {"n_tensors": n_t, "n_kv": n_kv, "kv": kv, "tensors": tensors, "data": data}

def gguf_crafted(src, model):
    """Crafted header fields of a GGUF (model: the model's own keys too; else a LoRA / state)."""
    L = gguf_layout(src)
    size = os.path.getsize(src)
    kv, ts = L["kv"], L["tensors"]
    out = []
    def at(label, off, data):
        out.append((label, "crafted", copy_then(src, lambda p, o=off, d=data: pwrite(p, o, d))))
    at("version=99", 4, u32(99))
    at("version=1", 4, u32(1))
    at("n_tensors=2^62", 8, u64(1 << 62))
    at("n_tensors+1", 8, u64(L["n_tensors"] + 1))
    at("n_tensors-1", 8, u64(L["n_tensors"] - 1))
    at("n_kv=2^62", 16, u64(1 << 62))
    at("n_kv+1", 16, u64(L["n_kv"] + 1))
    at("n_kv-1", 16, u64(L["n_kv"] - 1))
    first = next(iter(kv.values()))
    at("key0.len=2^62", first["klen"], u64(1 << 62))
    at("key0.len=2^32", first["klen"], u64(1 << 32))
    at("kv0.type=99", first["type_off"], u32(99))
    if first["type"] == 8:
        at("kv0.strlen=2^62", first["val"], u64(1 << 62))
    arrays = [(k, e) for k, e in kv.items() if e["type"] == 9]
    for k, e in arrays[-3:]:
        at(f"{k}.count=2^62", e["count_off"], u64(1 << 62))
        at(f"{k}.count-1", e["count_off"], u64(e["count"] - 1))
        at(f"{k}.elem_type=99", e["elem_type_off"], u32(99))
        at(f"{k}.elem_type=9(array)", e["elem_type_off"], u32(9))
        if e["elem_type"] == 8:
            at(f"{k}[0].len=2^62", e["first"], u64(1 << 62))
    def kv_val(key, label, data):
        if key in kv:
            at(f"{key}={label}", kv[key]["val"], data)
    nan, inf = struct.pack("<f", float("nan")), struct.pack("<f", float("inf"))
    if model:
        for key, vals in [("llama.block_count", [31, 0, 1 << 31]), ("llama.embedding_length", [577, 0]),
                          ("llama.feed_forward_length", [1537, 0]), ("llama.attention.head_count", [0, 7, 1 << 31]),
                          ("llama.attention.head_count_kv", [0, 2, 9 * 64]), ("llama.context_length", [0, 1 << 31]),
                          ("llama.vocab_size", [5, 1 << 31]), ("llama.rope.dimension_count", [0, 1000]),
                          ("tokenizer.ggml.bos_token_id", [1 << 31, 49152]), ("tokenizer.ggml.eos_token_id", [1 << 31]),
                          ("tokenizer.ggml.unknown_token_id", [1 << 31]), ("tokenizer.ggml.padding_token_id", [1 << 31]),
                          ("general.file_type", [1 << 31])]:
            for v in vals:
                kv_val(key, str(v), u32(v))
        for key in ("llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"):
            kv_val(key, "nan", nan)
            kv_val(key, "0", struct.pack("<f", 0.0))
            kv_val(key, "-1", struct.pack("<f", -1.0))
        if "general.architecture" in kv:  # "llama" -> "qwen2"/"zzzzz": same length
            at("architecture=qwen2", kv["general.architecture"]["val"] + 8, b"qwen2")
            at("architecture=zzzzz", kv["general.architecture"]["val"] + 8, b"zzzzz")
    else:
        if "adapter.lora.alpha" in kv:
            for lab, v in (("nan", nan), ("inf", inf), ("0", struct.pack("<f", 0.0)), ("-1", struct.pack("<f", -1.0))):
                kv_val("adapter.lora.alpha", lab, v)
        if "adapter.type" in kv:
            at("adapter.type=lorb", kv["adapter.type"]["val"] + 8, b"lorb")
        if "general.architecture" in kv:
            at("architecture=qwen2", kv["general.architecture"]["val"] + 8, b"qwen2")
        for k, e in kv.items():  # the optimizer state's step counter and friends
            if e["type"] in (4, 10) and k.startswith("sift."):
                kv_val(k, "2^62" if e["type"] == 10 else "2^31", u64(1 << 62) if e["type"] == 10 else u32(1 << 31))
                break
    t0_, tl = ts[0], ts[-1]
    at("t0.n_dims=0", t0_["n_dims_off"], u32(0))
    at("t0.n_dims=5", t0_["n_dims_off"], u32(5))
    at("t0.n_dims=2^31", t0_["n_dims_off"], u32(1 << 31))
    at("t0.dim0=0", t0_["dims_off"], u64(0))
    at("t0.dim0=2^40", t0_["dims_off"], u64(1 << 40))
    at("t0.dim0+1", t0_["dims_off"], u64(t0_["dims"][0] + 1))
    if t0_["n_dims"] >= 2:
        at("t0.dims=2^32x2^32", t0_["dims_off"], u64(1 << 32) + u64(1 << 32))
        at("t0.dim1+1", t0_["dims_off"] + 8, u64(t0_["dims"][1] + 1))
        at("t0.dim1-1", t0_["dims_off"] + 8, u64(t0_["dims"][1] - 1))
    at("t0.type=99", t0_["type_off"], u32(99))
    at("t0.type=F32", t0_["type_off"], u32(0))
    at("t0.type=Q4_0", t0_["type_off"], u32(2))
    at("t0.offset=2^62", t0_["offset_off"], u64(1 << 62))
    at("t0.offset+1", t0_["offset_off"], u64(t0_["offset"] + 1))
    at("t0.offset+32", t0_["offset_off"], u64(t0_["offset"] + 32))
    at("tlast.offset=data_end-32", tl["offset_off"], u64(size - L["data"] - 32))
    at("tlast.offset=2^64-32", tl["offset_off"], u64((1 << 64) - 32))
    at("t0.name.len=2^62", t0_["name_len"], u64(1 << 62))
    # rename: a missing tensor; a duplicate (t1 renamed to t0's name when the lengths match)
    nm = t0_["name"]
    at("t0.name:missing", t0_["name_off"] + len(nm) - 3, b"zzz")
    dup = next((t for t in ts[1:] if len(t["name"]) == len(nm)), None)
    if dup:
        at(f"dup-name:{dup['name']}->{nm}", dup["name_off"], nm.encode())
    if not model and nm.startswith("blk.0."):
        at("t0.layer=blk.9 (dup layer)", t0_["name_off"], b"blk.9.")
        at("t0.layer=blk.X", t0_["name_off"], b"blk.X.")
        lb = next((t for t in ts if t["name"].endswith("lora_b")), None)
        if lb:
            at(f"{lb['name']}->lora_c", lb["name_off"] + len(lb["name"]) - 1, b"c")
    return out

def json_crafted(src, edits):
    """edits: (label, fn(obj) -> obj or bytes) on a JSON file."""
    with open(src) as f:
        base = f.read()
    out = []
    for label, fn in edits:
        def make(dst, fn=fn):
            o = fn(json.loads(base))
            data = o if isinstance(o, bytes) else json.dumps(o, separators=(",", ":")).encode()
            with open(dst, "wb") as f:
                f.write(data)
        out.append((label, "crafted", make))
    return out

def setk(o, path, v):
    """o with o[path...] = v (path: keys / indexes; v DEL removes)."""
    cur = o
    for k in path[:-1]:
        cur = cur[k]
    if v is DEL:
        del cur[path[-1]]
    else:
        cur[path[-1]] = v
    return o

DEL = object()

def zero_histograms(o):
    for row in o["histograms"]:
        for h in row:
            h["bins"] = [0] * len(h["bins"])
            h["total"] = 0
    return o

def calib_crafted(src):
    with open(src) as f:
        keys = list(json.load(f).keys())
    e = [
        ("version=2", lambda o: setk(o, ["version"], 2)),
        ("version=-1", lambda o: setk(o, ["version"], -1)),
        ("version=2^32+1", lambda o: setk(o, ["version"], (1 << 32) + 1)),
        ("n_layer=29", lambda o: setk(o, ["n_layer"], 29)),
        ("n_layer=31", lambda o: setk(o, ["n_layer"], 31)),
        ("n_layer=0", lambda o: setk(o, ["n_layer"], 0)),
        ("n_layer=2^40", lambda o: setk(o, ["n_layer"], 1 << 40)),
        ("units=[1,1,1,1]", lambda o: setk(o, ["units"], [1, 1, 1, 1])),
        ("units.down+1", lambda o: setk(o, ["units", 3], o["units"][3] + 1)),
        ("units=[0,0,0,0]", lambda o: setk(o, ["units"], [0, 0, 0, 0])),
        ("units=[2^40]*4", lambda o: setk(o, ["units"], [1 << 40] * 4)),
        ("units=[576]", lambda o: setk(o, ["units"], [576])),
        ("histograms-last", lambda o: setk(o, ["histograms"], o["histograms"][:-1])),
        ("histograms[0][0].bins=[]", lambda o: setk(o, ["histograms", 0, 0, "bins"], [])),
        ("histograms all zero", zero_histograms),
        ("n_tokens=0", lambda o: setk(o, ["n_tokens"], 0)),
        ("allocations=[]", lambda o: setk(o, ["allocations"], [])),
        ("alloc.ratios-last", lambda o: setk(o, ["allocations", 0, "ratios"], o["allocations"][0]["ratios"][:-1])),
        ("alloc.ratio=1.0", lambda o: setk(o, ["allocations", 0, "ratios", 0, 0], 1.0)),
        ("alloc.ratio=-0.5", lambda o: setk(o, ["allocations", 0, "ratios", 0, 0], -0.5)),
        ("alloc.ratio=1e999", lambda o: json.dumps(o, separators=(",", ":")).replace('"target":0.5', '"target":1e999', 1).encode()),
        ("alloc.ratios[0]=[]", lambda o: setk(o, ["allocations", 0, "ratios", 0], [])),
        ("alloc.target=2", lambda o: setk(o, ["allocations", 0, "target"], 2.0)),
        ("clusters.centroids=[]", lambda o: setk(o, ["clusters", "centroids"], [])),
        ("clusters.sizes-last", lambda o: setk(o, ["clusters", "sizes"], o["clusters"]["sizes"][:-1])),
        ("clusters.centroid0-last-layer", lambda o: setk(o, ["clusters", "centroids", 0], o["clusters"]["centroids"][0][:-1])),
        ("clusters.centroid0[0]-last", lambda o: setk(o, ["clusters", "centroids", 0, 0], o["clusters"]["centroids"][0][0][:-1])),
        ("clusters.centroid0[0][0]=2^40", lambda o: setk(o, ["clusters", "centroids", 0, 0, 0], 1 << 40)),
        ("clusters.alpha=-1", lambda o: setk(o, ["clusters", "alpha"], -1.0)),
        ("channel_mean_abs-last", lambda o: setk(o, ["channel_mean_abs"], o["channel_mean_abs"][:-1])),
        ("channel_mean_abs[0][3]-last", lambda o: setk(o, ["channel_mean_abs", 0, 3], o["channel_mean_abs"][0][3][:-1])),
        ("column_norms={}", lambda o: setk(o, ["column_norms"], {})),
        ("column_norms.norms-last", lambda o: setk(o, ["column_norms", "norms"], o["column_norms"]["norms"][:-1])),
        ("weighted_histograms-last", lambda o: setk(o, ["weighted_histograms"], o["weighted_histograms"][:-1])),
        ("model=other.gguf", lambda o: setk(o, ["model"], "other.gguf")),
        ("json=null", lambda o: b"null"),
        ("json=[]", lambda o: b"[]"),
        ("json={version:1}", lambda o: b'{"version":1}'),
        ("not-utf8", lambda o: b'{"version":1,"model":"\xff\xfe"}'),
    ]
    for k in keys:
        if k != "version":
            e.append((f"drop:{k}", lambda o, k=k: setk(o, [k], DEL)))
    return json_crafted(src, e)

def header_json_crafted(src, magic_len, len_fmt, edits, crc=False):
    """Files with MAGIC, a length, a JSON header and a payload (trace, predictor). With `crc`, a
    CRC-32 of the header and the payload follows the length (predictor version 3): each edit is
    made twice, with the old CRC (refused by the checksum) and with one made for it ("+crc": the
    header's values then meet their own checks)."""
    with open(src, "rb") as f:
        b = f.read()
    ln = struct.calcsize(len_fmt)
    (hl,) = struct.unpack_from(len_fmt, b, magic_len)
    at = magic_len + ln + (4 if crc else 0)
    hdr = json.loads(b[at:at + hl])
    rest = b[at + hl:]
    out = []
    for label, fn in edits:
        for fix in ([False, True] if crc else [False]):
            def make(dst, fn=fn, fix=fix):
                h = fn(json.loads(json.dumps(hdr)))
                if isinstance(h, tuple):  # (raw header bytes, length field override)
                    raw, lfield = h
                else:
                    raw = json.dumps(h, separators=(",", ":")).encode()
                    lfield = len(raw)
                word = b""
                if crc:
                    word = struct.pack("<I", zlib.crc32(raw + rest)) if fix else b[magic_len + ln:at]
                with open(dst, "wb") as f:
                    f.write(b[:magic_len] + struct.pack(len_fmt, lfield) + word + raw + rest)
            out.append((label + ("+crc" if fix else ""), "crafted", make))
    return out

def trace_crafted(src):
    return header_json_crafted(src, 8, "<I", [
        ("n_layer=29", lambda h: setk(h, ["n_layer"], 29)),
        ("n_layer=31", lambda h: setk(h, ["n_layer"], 31)),
        ("n_layer=0", lambda h: setk(h, ["n_layer"], 0)),
        ("n_layer=2^40", lambda h: setk(h, ["n_layer"], 1 << 40)),
        ("n_embd=577", lambda h: setk(h, ["n_embd"], 577)),
        ("n_embd=0", lambda h: setk(h, ["n_embd"], 0)),
        ("dims.down+1", lambda h: setk(h, ["dims", 3], h["dims"][3] + 1)),
        ("dims.qkv-1", lambda h: setk(h, ["dims", 0], h["dims"][0] - 1)),
        ("dims=[0,0,0,0]", lambda h: setk(h, ["dims"], [0, 0, 0, 0])),
        ("dims=[2^40]*4", lambda h: setk(h, ["dims"], [1 << 40] * 4)),
        ("dims=[576]", lambda h: setk(h, ["dims"], [576])),
        ("selector=zz", lambda h: setk(h, ["selector"], "zz")),
        ("n_ctx=0", lambda h: setk(h, ["n_ctx"], 0)),
        ("n_ctx=2^40", lambda h: setk(h, ["n_ctx"], 1 << 40)),
        ("n_batch=0", lambda h: setk(h, ["n_batch"], 0)),
        ("runtime_bytes=2^63", lambda h: setk(h, ["runtime_bytes"], 1 << 63)),
        ("measured_tok_s=-1", lambda h: setk(h, ["measured_tok_s"], -1.0)),
        ("model=other.gguf", lambda h: setk(h, ["model"], "other.gguf")),
        ("drop:dims", lambda h: setk(h, ["dims"], DEL)),
        ("header=null", lambda h: (b"null", 4)),
        ("hdrlen=2^31", lambda h: (json.dumps(h, separators=(",", ":")).encode(), 1 << 31)),
        ("hdrlen=0", lambda h: (json.dumps(h, separators=(",", ":")).encode(), 0)),
        ("hdrlen+1", lambda h: (json.dumps(h, separators=(",", ":")).encode(), len(json.dumps(h, separators=(",", ":"))) + 1)),
        ("hdrlen=2^32-1", lambda h: (json.dumps(h, separators=(",", ":")).encode(), (1 << 32) - 1)),
    ])

def pred_crafted(src):
    return header_json_crafted(src, 12, "<I", crc=True, edits=[
        ("version=1", lambda h: setk(h, ["version"], 1)),
        ("version=99", lambda h: setk(h, ["version"], 99)),
        ("n_layer=29", lambda h: setk(h, ["n_layer"], 29)),
        ("n_layer=31", lambda h: setk(h, ["n_layer"], 31)),
        ("n_layer=0", lambda h: setk(h, ["n_layer"], 0)),
        ("n_embd=577", lambda h: setk(h, ["n_embd"], 577)),
        ("n_ff=1537", lambda h: setk(h, ["n_ff"], 1537)),
        ("n_ff=0", lambda h: setk(h, ["n_ff"], 0)),
        ("rank=65", lambda h: setk(h, ["rank"], 65)),
        ("rank=0", lambda h: setk(h, ["rank"], 0)),
        ("rank=2^40", lambda h: setk(h, ["rank"], 1 << 40)),
        ("rank=2^62", lambda h: setk(h, ["rank"], 1 << 62)),
        ("comp_rank=0", lambda h: setk(h, ["comp_rank"], 0)),
        ("comp_rank=2^40", lambda h: setk(h, ["comp_rank"], 1 << 40)),
        ("keep=1.5", lambda h: setk(h, ["keep"], 1.5)),
        ("keep=-1", lambda h: setk(h, ["keep"], -1.0)),
        ("keep=0", lambda h: setk(h, ["keep"], 0.0)),
        ("crc32+1", lambda h: setk(h, ["crc32"], h["crc32"] + 1)),
        ("comp_on=true", lambda h: setk(h, ["comp_on"], True)),
        ("attn_mass-last", lambda h: setk(h, ["attn_mass"], h["attn_mass"][:-1])),
        ("attn_mass=[]", lambda h: setk(h, ["attn_mass"], [])),
        ("attn_mass[0]=-1", lambda h: setk(h, ["attn_mass", 0], -1.0)),
        ("attn_mass[0]=1e300", lambda h: setk(h, ["attn_mass", 0], 1e300)),
        ("attn_mass=zeros", lambda h: setk(h, ["attn_mass"], [0.0] * len(h["attn_mass"]))),
        ("comp_check=[]", lambda h: setk(h, ["comp_check"], [])),
        ("drop:rank", lambda h: setk(h, ["rank"], DEL)),
        ("header=null", lambda h: (b"null", 4)),
        ("hdrlen=2^31", lambda h: (json.dumps(h, separators=(",", ":")).encode(), 1 << 31)),
        ("hdrlen=0", lambda h: (json.dumps(h, separators=(",", ":")).encode(), 0)),
        ("hdrlen-1", lambda h: (json.dumps(h, separators=(",", ":")).encode(), len(json.dumps(h, separators=(",", ":"))) - 1)),
    ])

def profile_crafted(src):
    with open(src) as f:
        text = f.read()
    def sub(pat, rep, count=1):
        return lambda t: re.sub(pat, rep, t, count=count, flags=re.M)
    e = [
        ("threads=0", sub(r"^threads = .*$", "threads = 0")),
        ("threads=-1", sub(r"^threads = .*$", "threads = -1")),
        ("threads=2^40", sub(r"^threads = .*$", "threads = 1099511627776")),
        ("mem_read_bw=0", sub(r"^mem_read_bw = .*$", "mem_read_bw = 0.0")),
        ("mem_read_bw=-1", sub(r"^mem_read_bw = .*$", "mem_read_bw = -1.0")),
        ("mem_read_bw=nan", sub(r"^mem_read_bw = .*$", "mem_read_bw = nan")),
        ("mem_read_bw=inf", sub(r"^mem_read_bw = .*$", "mem_read_bw = inf")),
        ("mem_read_bw=5e-324", sub(r"^mem_read_bw = .*$", "mem_read_bw = 5e-324")),
        ("mem_copy_bw=0", sub(r"^mem_copy_bw = .*$", "mem_copy_bw = 0.0")),
        ("mem_copy_bw=nan", sub(r"^mem_copy_bw = .*$", "mem_copy_bw = nan")),
        ("read_align=0", sub(r"^read_align = .*$", "read_align = 0")),
        ("read_align=3", sub(r"^read_align = .*$", "read_align = 3")),
        ("read_align=2^62", sub(r"^read_align = .*$", "read_align = 4611686018427387904")),
        ("max_qd=0", sub(r"^max_qd = .*$", "max_qd = 0")),
        ("max_qd=2^40", sub(r"^max_qd = .*$", "max_qd = 1099511627776")),
        ("points=[]", lambda t: re.sub(r"points = \[.*?\n\]", "points = []", t, count=1, flags=re.S)),
        ("points=one", lambda t: re.sub(r"(points = \[\n[^\n]*\n).*?\n\]", r"\1]", t, count=1, flags=re.S)),
        ("bw=0 all", sub(r"bw = [0-9.e+]+", "bw = 0.0", 0)),
        ("bw=nan all", sub(r"bw = [0-9.e+]+", "bw = nan", 0)),
        ("bw=-1 first", sub(r"bw = [0-9.e+]+", "bw = -1.0")),
        ("lat_ns=0 all", sub(r"lat_ns = [0-9.e+]+", "lat_ns = 0.0", 0)),
        ("lat_ns=inf all", sub(r"lat_ns = [0-9.e+]+", "lat_ns = inf", 0)),
        ("size=0 first", sub(r"size = \d+", "size = 0")),
        ("qd=0 first", sub(r"qd = \d+", "qd = 0")),
        ("size=2^62 first", sub(r"size = \d+", "size = 4611686018427387904")),
        ("dispatch_ns=nan", sub(r"^dispatch_ns = .*$", "dispatch_ns = nan")),
        ("dispatch_ns=-1", sub(r"^dispatch_ns = .*$", "dispatch_ns = -1.0")),
        ("dispatch_ns=1e300", sub(r"^dispatch_ns = .*$", "dispatch_ns = 1e300")),
        ("kernel_efficiency=0", sub(r"^kernel_efficiency = .*$", "kernel_efficiency = 0.0")),
        ("kernel_efficiency=nan", sub(r"^kernel_efficiency = .*$", "kernel_efficiency = nan")),
        ("columns.Q4_1=0", sub(r"^Q4_1 = .*$", "Q4_1 = 0.0")),
        ("columns.Q4_1=nan", sub(r"^Q4_1 = .*$", "Q4_1 = nan")),
        ("columns.Q4_1 removed", sub(r"^Q4_1 = .*\n", "")),
        ("dense.* removed", lambda t: re.sub(r"\[compute\.dense\]\n(?:[^\n\[]*\n)*", "[compute.dense]\n", t, count=1)),
        ("no [compute]", lambda t: t.split("[compute]")[0]),
        ("no [disk]", lambda t: re.sub(r"\[disk\].*?\n\]\n", "", t, count=1, flags=re.S)),
        ("dup key", lambda t: t.replace("threads = ", "threads = 1\nthreads = ", 1)),
        ("name=''", sub(r'^name = .*$', 'name = ""')),
        ("from_paper=1", sub(r"^from_paper = .*$", "from_paper = 1")),
    ]
    out = []
    for label, fn in e:
        new = fn(text)
        if new == text:
            print(f"note: profile edit {label} matched nothing", flush=True)
            continue
        out.append((label, "crafted", write_bytes(new.encode())))
    return out

def pack_crafted(src):
    with open(src, "rb") as f:
        head = f.read(64)
    magic, ver, flags, toff, tlen, tcrc, flen = struct.unpack_from("<8sIIQQIQ", head)
    with open(src, "rb") as f:
        f.seek(toff)
        toc_raw = f.read(tlen)
    out = []
    def at(label, off, data):
        out.append((label, "crafted", copy_then(src, lambda p, o=off, d=data: pwrite(p, o, d))))
    at("version=99", 8, u32(99))
    at("version=1", 8, u32(1))
    at("flags=0xffffffff", 12, u32(0xFFFFFFFF))
    at("toc_offset=2^62", 16, u64(1 << 62))
    at("toc_offset=0", 16, u64(0))
    at("toc_offset+1", 16, u64(toff + 1))
    at("toc_len=0", 24, u64(0))
    at("toc_len=2^62", 24, u64(1 << 62))
    at("toc_len=2^64-1", 24, u64((1 << 64) - 1))
    at("file_len=2^62", 36, u64(1 << 62))
    at("file_len=0", 36, u64(0))
    def toc_edit(label, fn):
        def make(dst, fn=fn):
            t = fn(json.loads(toc_raw))
            raw = t if isinstance(t, bytes) else json.dumps(t, separators=(",", ":")).encode()
            shutil.copyfile(src, dst)
            with open(dst, "r+b") as f:
                f.truncate(toff)
                f.seek(toff)
                f.write(raw)
                f.seek(24)
                f.write(u64(len(raw)))
                f.seek(32)
                f.write(u32(zlib.crc32(raw)))
                f.seek(36)
                f.write(u64(toff + len(raw)))
        out.append((f"toc:{label}", "crafted", make))
    c0 = ["columns", 0]
    for label, fn in [
        ("version=99", lambda t: setk(t, ["version"], 99)),
        ("source.path=/nonexistent (GGUF beside)", lambda t: setk(t, ["source", "path"], "/nonexistent/" + os.path.basename(M))),
        ("source.size+1", lambda t: setk(t, ["source", "size"], t["source"]["size"] + 1)),
        ("source=this pack", lambda t: setk(t, ["source", "path"], os.path.abspath(P))),
        ("gguf_header_len=0", lambda t: setk(t, ["gguf_header_len"], 0)),
        ("gguf_header_len=2^62", lambda t: setk(t, ["gguf_header_len"], 1 << 62)),
        ("gguf_header_len+32", lambda t: setk(t, ["gguf_header_len"], t["gguf_header_len"] + 32)),
        ("col0.n_in+1", lambda t: setk(t, c0 + ["n_in"], t["columns"][0]["n_in"] + 1)),
        ("col0.n_in=0", lambda t: setk(t, c0 + ["n_in"], 0)),
        ("col0.n_in=2^40", lambda t: setk(t, c0 + ["n_in"], 1 << 40)),
        ("col0.n_out-32", lambda t: setk(t, c0 + ["n_out"], t["columns"][0]["n_out"] - 32)),
        ("col0.n_out=0", lambda t: setk(t, c0 + ["n_out"], 0)),
        ("col0.col_bytes+1", lambda t: setk(t, c0 + ["col_bytes"], t["columns"][0]["col_bytes"] + 1)),
        ("col0.col_bytes=0", lambda t: setk(t, c0 + ["col_bytes"], 0)),
        ("col0.offset=2^62", lambda t: setk(t, c0 + ["offset"], 1 << 62)),
        ("col0.offset=col1", lambda t: setk(t, c0 + ["offset"], t["columns"][1]["offset"])),
        ("col0.len=2^62", lambda t: setk(t, c0 + ["len"], 1 << 62)),
        ("col0.len=2^64-1", lambda t: setk(t, c0 + ["len"], (1 << 64) - 1)),
        ("col0.len=0", lambda t: setk(t, c0 + ["len"], 0)),
        ("col0.scales_len=0", lambda t: setk(t, c0 + ["scales_len"], 0)),
        ("col0.scales_offset=2^62", lambda t: setk(t, c0 + ["scales_offset"], 1 << 62)),
        ("col0.layer=99", lambda t: setk(t, c0 + ["layer"], 99)),
        ("col0.layer=1 (dup)", lambda t: setk(t, c0 + ["layer"], 1)),
        ("col0.op=zz", lambda t: setk(t, c0 + ["op"], "zz")),
        ("col0.op=k (dup)", lambda t: setk(t, c0 + ["op"], "k")),
        ("col0.ty=exact:Q8_0", lambda t: setk(t, c0 + ["ty"], "exact:Q8_0")),
        ("col0.ty=q8_0", lambda t: setk(t, c0 + ["ty"], "q8_0")),
        ("col0.ty=zz", lambda t: setk(t, c0 + ["ty"], "zz")),
        ("drop col0", lambda t: setk(t, ["columns"], t["columns"][1:])),
        ("drop last col", lambda t: setk(t, ["columns"], t["columns"][:-1])),
        ("columns=[]", lambda t: setk(t, ["columns"], [])),
        ("orders=[{}]", lambda t: setk(t, ["orders"], [{}])),
        ("toc=null", lambda t: b"null"),
        ("toc={}", lambda t: b"{}"),
    ]:
        toc_edit(label, fn)
    return out

# ---- the kinds: good file, consumers, damage ----------------------------------------------

def kinds():
    rng = lambda k: random.Random(f"{SEED}-{k}")
    K = {}
    calib = [
        ("threshold", lambda f: [S, "generate", "-m", P, "--sparsity", "threshold", "--calib", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("core-sim", lambda f: [S, "generate", "-m", P, "--sparsity", "core-sim", "--calib", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("static-cache", lambda f: [S, "generate", "-m", P, "--memory", "150M", "--cache-policy", "static", "--calib", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("simulate-static", lambda f: [S, "simulate", "--trace", g("t.trace"), "-m", P, "--profile", g("p.toml"), "--memory", "100M",
                                      "--policy", "static", "--sparsity", "recorded,threshold", "--calib", f]),
    ]
    K["calib"] = dict(good=g("c.json"), name="c.json", consumers=calib,
                      muts=lambda: generic(g("c.json"), rng("calib"), 10, 5, foreign=[g("p.toml"), g("t.trace")]) + calib_crafted(g("c.json")))
    trace = [
        ("simulate", lambda f: [S, "simulate", "--trace", f, "-m", P, "--profile", g("p.toml"), "--memory", "100M"]),
        ("simulate-topk", lambda f: [S, "simulate", "--trace", f, "-m", P, "--profile", g("p.toml"), "--memory", "100M", "--sparsity", "topk,dip", "--policy", "lfu,belady"]),
        ("plan", lambda f: [S, "plan", "-m", P, "--memory", "100M", "--profile", g("p.toml"), "--trace", f]),
    ]
    K["trace"] = dict(good=g("t.trace"), name="t.trace", consumers=trace,
                      muts=lambda: generic(g("t.trace"), rng("trace"), 8, 7, head=256, foreign=[g("pred.prefill"), g("c.json")]) + trace_crafted(g("t.trace")))
    prof = [
        # (with --trace: without one, plan tests whether models/ is writable with a temporary file)
        ("plan", lambda f: [S, "plan", "-m", P, "--memory", "100M", "--profile", f, "--trace", g("t.trace")]),
        ("plan-cost-model", lambda f: [S, "plan", "-m", P, "--memory", "100M", "--profile", f, "--cost-model"]),
        ("simulate", lambda f: [S, "simulate", "--trace", g("t.trace"), "-m", P, "--profile", f, "--memory", "100M"]),
        ("generate", lambda f: [S, "generate", "-m", P, "--memory", "150M", "--profile", f, "-p", "Hello", "-n", "2", "-t", "1"]),
    ]
    K["profile"] = dict(good=g("p.toml"), name="p.toml", consumers=prof,
                        muts=lambda: generic(g("p.toml"), rng("profile"), 10, 5, head=1500, foreign=[g("c.json"), g("t.trace")]) + profile_crafted(g("p.toml")))
    pred = [
        ("prefill", lambda f: [S, "generate", "-m", M, "--prefill-sparsity", "0.5", "--prefill-predictor", f, "-f", g("prompt.txt"), "-n", "1", "-t", "1"]),
        ("prefill-comp-on", lambda f: [S, "generate", "-m", M, "--prefill-sparsity", "0.5", "--prefill-predictor", f, "--prefill-compensator", "on", "-f", g("prompt.txt"), "-n", "1", "-t", "1"]),
    ]
    K["predictor"] = dict(good=g("pred.prefill"), name="pred.prefill", consumers=pred,
                          muts=lambda: generic(g("pred.prefill"), rng("pred"), 8, 7, head=1200, foreign=[g("t.trace"), g("l.lora.gguf")]) + pred_crafted(g("pred.prefill")))
    lora = [
        ("generate", lambda f: [S, "generate", "-m", M, "--lora", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("generate-topk-pack", lambda f: [S, "generate", "-m", P, "--sparsity", "topk", "--ratio", "0.5", "--lora", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("export-lora", lambda f: [S, "export-lora", "-m", M, "--lora", f, "-o", OUT + "/fused.gguf", "--force"]),
    ]
    ll = gguf_layout(g("l.lora.gguf"))
    K["lora"] = dict(good=g("l.lora.gguf"), name="l.lora.gguf", consumers=lora,
                     muts=lambda: generic(g("l.lora.gguf"), rng("lora"), 10, 5, head=ll["data"], foreign=[M, g("l.lora.gguf.adam"), g("c.json")]) + gguf_crafted(g("l.lora.gguf"), False))
    # the optimizer state `train distill --resume` reads beside its output (the adapters stay good)
    adam = [("distill-resume", lambda f: [S, "train", "distill", "-m", M, "-f", TXT, "--steps", "1", "--sparsity", "topk", "--ratio", "0.5",
                                          "--tokens", "64", "--seq", "32", "-o", f[:-len(".adam")], "--no-fuse", "--resume", "--force", "-t", "1"])]
    al = gguf_layout(g("l.lora.gguf.adam"))
    # (a missing state is by design: a warning, and the moments start again)
    K["adam"] = dict(good=g("l.lora.gguf.adam"), name="l.lora.gguf.adam", consumers=adam, beside=[(g("l.lora.gguf"), "l.lora.gguf")], missing_ok=True,
                     muts=lambda: generic(g("l.lora.gguf.adam"), rng("adam"), 6, 3, head=al["data"], foreign=[g("l.lora.gguf"), g("c.json")])
                     + [m for m in gguf_crafted(g("l.lora.gguf.adam"), False) if not m[0].startswith(("t0.layer", "dup-name"))][:14])
    pack = [
        ("generate", lambda f: [S, "generate", "-m", f, "-p", "Hello", "-n", "2", "-t", "1"]),
        ("generate-150M", lambda f: [S, "generate", "-m", f, "--memory", "150M", "-p", "Hello", "-n", "2", "-t", "1"]),
    ]
    def pack_muts():
        with open(P, "rb") as fh:
            toff = struct.unpack_from("<Q", fh.read(64), 16)[0]
        r = rng("pack")
        gm = generic(P, r, 0, 0, foreign=[M, g("c.json")])
        flips = []
        size = os.path.getsize(P)
        for o in [r.randrange(64) for _ in range(3)] + [r.randrange(64, 4096)] + [r.randrange(4096, toff) for _ in range(3)] + [r.randrange(toff, size) for _ in range(3)]:
            x = r.randrange(1, 256)
            flips.append((f"flip@{o}^{x:#04x}", "flip", copy_then(P, flip_at(o, x))))
        return gm + flips + pack_crafted(P)
    K["pack"] = dict(good=P, name=os.path.basename(P), consumers=pack, beside=[(os.path.abspath(M), os.path.basename(M), "link")], muts=pack_muts)
    # the pack's `.verified` record (a good pack beside it)
    ver = [("generate-150M", lambda f: [S, "generate", "-m", f[:-len(".verified")], "--memory", "150M", "-p", "Hello", "-n", "2", "-t", "1"])]
    def verified_muts():
        good = f"{MUT}/verified-src"
        if not os.path.exists(good + "/ok.sift.verified"):
            rm(good)
            os.makedirs(good)
            shutil.copyfile(P, good + "/ok.sift")
            run([S, "generate", "-m", good + "/ok.sift", "--memory", "150M", "-p", "Hi", "-n", "1", "-t", "1"])
        src = good + "/ok.sift.verified"
        if not os.path.exists(src):
            print("note: no .verified written for a pack copy; skipping the verified kind", flush=True)
            return []
        with open(src) as fh:
            text = fh.read()
        crafted = [
            ("size=2^64", "crafted", write_bytes(re.sub(r"size \d+", "size 18446744073709551616", text).encode())),
            ("mtime=nan", "crafted", write_bytes(re.sub(r"mtime [\d.]+", "mtime nan", text).encode())),
            ("fields doubled", "crafted", write_bytes((text.strip() + " " + text.strip()).encode())),
            ("huge line", "crafted", write_bytes(b"sift pack verified: " + b"9" * 100000)),
        ]
        return generic(src, rng("verified"), 8, 0, foreign=[g("c.json")]) + crafted
    K["verified"] = dict(good=None, name="ok.sift.verified", consumers=ver, pack_copy=True, expect="cache", muts=verified_muts)
    gg = [("generate", lambda f: [S, "generate", "-m", f, "-p", "Hello", "-n", "2", "-t", "1"])]
    def gguf_muts():
        r = rng("gguf")
        lay = gguf_layout(M)
        gm = generic(M, r, 6, 0, foreign=[g("l.lora.gguf"), P])
        size = os.path.getsize(M)
        for o in [r.randrange(4096, lay["data"]) for _ in range(6)] + [r.randrange(lay["data"], size) for _ in range(2)]:
            x = r.randrange(1, 256)
            gm.insert(-4, (f"flip@{o}^{x:#04x}", "flip", copy_then(M, flip_at(o, x))))
        gm.insert(3, ("trunc@4096", "trunc", copy_then(M, lambda p: os.truncate(p, 4096))))
        gm.insert(4, ("trunc@data_offset", "trunc", copy_then(M, lambda p: os.truncate(p, lay["data"]))))
        return gm + gguf_crafted(M, True)
    K["gguf"] = dict(good=M, name="model.gguf", consumers=gg, muts=gguf_muts)
    budget = [("start", None), ("live", None)]
    def budget_muts():
        vals = [("", "empty"), ("garbage", "value"), ("  \n\t ", "empty"),
                ("18446744073709551616", "value"), ("18446744073709551615", "value"), ("99999999999999999999999G", "value"),
                ("17179869184G", "value"), ("1048577G", "value"), ("1e30", "value"), ("1e308G", "value"), ("-1", "value"),
                ("-300M", "value"), ("0", "value"), ("0%", "value"), ("1000%", "good-value"), ("1e300%", "value"), ("nan", "value"),
                ("inf", "value"), ("NaN%", "value"), ("1", "value"), ("0.5", "value"), ("1K", "value"), ("300M 400M", "value"),
                ("300M\n400M\n", "value"), ("３００M", "value"), ("300€", "value"), ("é", "value"), ("300M\0", "value"),
                ("a" * 4095 + "é", "value"), ("300M" + " " * 5000, "good-value"), ("9" * 5000, "value")]
        out = [(f"{v[:24]!r}" + (f"..({len(v)})" if len(v) > 24 else ""), c, write_bytes(v.encode())) for v, c in vals]
        r = rng("budget")
        out.append(("binary4KiB", "value", write_bytes(bytes(r.randrange(256) for _ in range(4096)))))
        out.append(("binary-nul", "value", write_bytes(b"\0" * 64)))
        out.append(("not-utf8", "value", write_bytes(b"300\xffM")))
        out.append(("foreign:c.json", "value", copy_then(g("c.json"))))
        out.append(("directory", "dir", lambda d: os.mkdir(d)))
        out.append(("missing", "missing", lambda d: None))
        out.append(("fifo", "value", lambda d: os.mkfifo(d)))
        return out
    K["budget"] = dict(good=g("b.txt"), name="b.txt", consumers=budget, budget=True, muts=budget_muts)
    return K

# ---- budget file runs: at start, and rewritten during the run (with SIGUSR1) -------------------

BUDGET_CMD = lambda f, n: [S, "generate", "-m", P, "--memory", "300M", "--budget-file", f, "-p", "Hello", "-n", str(n), "--ignore-eos", "-t", "1"]

def sigusr1_caught(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    except OSError:
        pass
    return False

def run_live(path, make, timeout=TIMEOUT):
    """Starts with a good budget file, damages it once SIGUSR1 is handled, signals, waits."""
    with open(path, "w") as fh:
        fh.write("300M\n")
    args = BUDGET_CMD(path, 100)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    t = time.time()
    while p.poll() is None and not sigusr1_caught(p.pid) and time.time() - t < 20:
        time.sleep(0.01)
    late = p.poll() is not None
    if not late:
        time.sleep(0.1)
        rm(path)
        make(path)
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            late = True
    try:
        out, err = p.communicate(timeout=timeout)
        return args, p.returncode, err.decode("utf-8", "replace"), False, late
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return args, p.returncode, err.decode("utf-8", "replace"), True, late

# ---- main ---------------------------------------------------------------------------------

def models_state():
    """models/ and its files (sizes, times): a probe that writes there is a bug of the probe."""
    return [os.stat("models").st_mtime_ns] + sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir("models"))

def main():
    os.makedirs(W, exist_ok=True)
    before = models_state()
    setup()
    K = kinds()
    want = sys.argv[1:] or list(K)
    for k in want:
        if k not in K:
            sys.exit(f"unknown kind {k}; kinds: {' '.join(K)}")
    for kind in want:
        spec = K[kind]
        kt = time.time()
        muts = spec["muts"]()
        if spec.get("good"):
            muts = [("good", "good", copy_then(spec["good"]) if not spec.get("budget") else write_bytes(b"300M\n"))] + muts
        nrun = 0
        for label, cat, make in muts:
            d = fresh_dir(kind)
            for b in spec.get("beside", []):
                if len(b) == 3:
                    os.symlink(b[0], f"{d}/{b[1]}")
                else:
                    shutil.copyfile(b[0], f"{d}/{b[1]}")
            if spec.get("pack_copy"):
                shutil.copyfile(P, f"{d}/ok.sift")
            f = f"{d}/{spec['name']}"
            make(f)
            for cons, argv in spec["consumers"]:
                t = time.time()
                if spec.get("budget"):
                    if cons == "start":
                        args = BUDGET_CMD(f, 2)
                        rc, err, hung = run(args, timeout=15 if label == "fifo" else TIMEOUT)
                    else:
                        rm(f)
                        args, rc, err, hung, late = run_live(f, make, timeout=15 if label == "fifo" else TIMEOUT)
                        if late:
                            print(f"{kind} [{label}] live: the run ended before the file could be changed (not counted)", flush=True)
                            continue
                        args = args + [f"(file rewritten to {label} + SIGUSR1 mid-run)"]
                    judge(kind, label, cat, cons, args, rc, err, hung, time.time() - t, expect="warn")
                else:
                    args = argv(f)
                    rc, err, hung = run(args)
                    judge(kind, label, cat, cons, args, rc, err, hung, time.time() - t, expect=spec.get("expect", "refuse"),
                          missing_ok=spec.get("missing_ok", False))
                nrun += 1
                for extra in (OUT + "/fused.gguf",):
                    if os.path.exists(extra):
                        os.remove(extra)
            acc = crafted_accepts.get((kind, label))
            if acc:
                counts["accepted-crafted(review)"] = counts.get("accepted-crafted(review)", 0) + 1
                print(f"{kind} [{label}]: accepted (crafted; review) by {','.join(acc)}", flush=True)
        rm(f"{MUT}/{kind}")
        print(f"-- {kind}: {len(muts)} files, {nrun} runs in {time.time() - kt:.0f} s", flush=True)
    after = models_state()
    if after != before:
        print(f"WARNING: models/ changed during the probe (or another process wrote there): "
              f"{sorted(set(map(str, after)) ^ set(map(str, before)))}", flush=True)
    with open(W + "/results.jsonl", "w") as fh:
        for r in results:
            fh.write(json.dumps(r) + "\n")
    order = ["OK-refused", "OK-accepted", "PANIC", "SIGNAL", "HANG", "REFUSED-NO-MESSAGE", "suspicious-accept"]
    keys = order + sorted(k for k in counts if k not in order)
    print("summary: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in keys) + f"; {len(results)} runs in {time.time() - t0:.0f} s", flush=True)

if __name__ == "__main__":
    main()

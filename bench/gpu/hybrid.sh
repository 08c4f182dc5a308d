#!/usr/bin/env bash
# Issue 20's hybrid decode on the lent GPU machine (no Rust toolchain, at most 64 MiB of files per
# call): the stripped `sift` and the engine's GPU test binary built here with the `cuda` feature,
# and the default model in two pieces, carried in .dev/c1 and .dev/c2 (docs/gpu.md).
#   stage 1: keeps the first piece and the binaries, prints the machine;
#   stage 2: joins the model, packs it, runs the engine's GPU tests (hybrid logits for every
#            policy) and the decode benchmarks: CPU, llama.cpp-style layer split and every hybrid
#            policy at GPU budgets of 25/50/75 % of the model, Top-K 0.5, 256 tokens per prompt.
set -u
stage=$1
keep=/tmp/sift
mkdir -p "$keep"
nvrtc=$(find /usr/local/cuda*/ /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=${nvrtc:+$(dirname "$nvrtc"):}${LD_LIBRARY_PATH:-}
if [ ! -e /work/main/tests ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
if [ "$stage" = 1 ]; then
    cp -r .dev/c1/* "$keep"/
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
    lscpu | grep -E 'Model name|^CPU\(s\)'
    exit 0
fi
S=$keep/sift
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
P=models/SmolLM2-135M-Instruct.Q4_1.sift
T=${THREADS:-8}
N=${NGEN:-256}
mkdir -p models
[ -e $M ] || cat "$keep"/part_a .dev/c2/part_b > $M
sha256sum $M
[ -e $P ] || $S pack $M -o $P 2>&1 | tail -1
timeout 240 "$keep"/gputest --nocapture --test-threads 1 2>&1 | tee "$OUT"/engine.log | grep -vE '^\s*$' | tail -30
# NOBENCH=1: the tests only.
[ -n "${NOBENCH:-}" ] && exit 0
$S probe --gpu -o "$OUT"/gpu-probe.json 2>&1 | tail -9
head -c 2000 tests/fixtures/wiki.test.head16k.raw | tail -c 1200 > /tmp/p1.txt
tail -c 1200 tests/fixtures/wiki.test.head16k.raw > /tmp/p2.txt
run() { # label, args...
    local label=$1; shift
    for p in /tmp/p1.txt /tmp/p2.txt; do
        echo "== $label | sift generate -f $p -n $N --temp 0 --ignore-eos -t $T $*"
        $S generate -f $p -n $N --temp 0 --ignore-eos -t $T "$@" 2>&1 >/dev/null |
            grep -E 'eval time|hybrid|error|offloaded|GPU' | grep -v 'prompt eval'
    done
}
{
    run cpu-dense -m $M
    run cpu-topk -m $P --sparsity topk --ratio 0.5
    for B in 25% 50% 75%; do
        run "layers-dense $B" -m $M --gpu-memory $B
        for pol in static eager lru tam tam-adaptive; do
            run "hybrid $pol $B" -m $P --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol
        done
        run "hybrid tam-adaptive g16 $B" -m $P --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy tam-adaptive --gpu-group-size 16
    done
} 2>&1 | tee "$OUT"/hybrid.log

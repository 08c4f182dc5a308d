#!/usr/bin/env bash
# The GPU checks of issue 20, run on the lent GPU machine (no Rust toolchain, at most 64 MiB of
# files per call): binaries built here with `--features cuda`, stripped, and the default model in
# two pieces, carried in .dev/c1 and .dev/c2 (see docs/gpu.md for how they are made).
#   stage 1: keeps the first piece, prints the machine, runs the kernel tests on real Qwen2.5
#            matrices (Q4_K, Q5_0, Q6_K, Q8_0);
#   stage 2: joins the model, runs every GPU test and the benchmarks (CPU vs -ngl splits).
set -u
stage=$1
keep=/tmp/sift
mkdir -p "$keep"
nvrtc=$(find /usr/local/cuda*/ /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=${nvrtc:+$(dirname "$nvrtc"):}${LD_LIBRARY_PATH:-}
# The test binaries find the model under the path they were built in.
if [ ! -e /work/main/tests ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
if [ "$stage" = 1 ]; then
    cp -r .dev/c1/* "$keep"/
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
    lscpu | grep -E 'Model name|^CPU\(s\)'
    echo "nvrtc: $nvrtc"
    SIFT_GPU_TEST_GGUF=$keep/qwen05-l0.gguf:$keep/qwen15-l0.gguf "$keep"/kernels --nocapture --test-threads 1 \
        --skip requantized --skip many_products 2>&1
    exit 0
fi
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p models
cat "$keep"/part_a .dev/c2/part_b > $M
sha256sum $M
SIFT_GPU_TEST_GGUF=$keep/qwen05-l0.gguf:$keep/qwen15-l0.gguf "$keep"/kernels --nocapture --test-threads 1 2>&1 | tee "$OUT"/kernels.log
"$keep"/gputest --nocapture --test-threads 1 2>&1 | tee "$OUT"/engine.log
S=$keep/sift
T=${THREADS:-8}
$S probe --quick -m $M 2>&1 | grep -iE 'dram|memory|disk|read' | head -8
for args in "" "-ngl 99" "-ngl 15" "--gpu-memory 25%" "--gpu-memory 75%" \
    "-ngl 99 --sparsity topk --ratio 0.5 --dense-kernels" "--sparsity topk --ratio 0.5 --dense-kernels"; do
    echo "== sift bench -m $M -p 512 -n 128 -r 3 -t $T $args"
    $S bench -m $M -p 512 -n 128 -r 3 -t $T $args 2>&1 | grep -vE '^\s*$' | tail -6
done 2>&1 | tee "$OUT"/bench.log
# Where a GPU decode step's time goes: at depth 0 and 1024 (attention's share), with 1 and 8 host
# threads (the CPU side's share).
for args in "-t 8 -d 0" "-t 8 -d 1024" "-t 1 -d 0"; do
    echo "== sift bench -m $M -p 512 -n 128 -r 3 -ngl 99 $args"
    $S bench -m $M -p 512 -n 128 -r 3 -ngl 99 $args 2>&1 | grep -E '^\| llama'
done 2>&1 | tee -a "$OUT"/bench.log
for args in "" "-ngl 99"; do
    echo "== sift perplexity -m $M -f tests/fixtures/wiki.test.head16k.raw -c 512 -t $T $args"
    $S perplexity -m $M -f tests/fixtures/wiki.test.head16k.raw -c 512 -t $T $args 2>&1 | grep -iE 'estimate|offloaded|error' | tail -3
done 2>&1 | tee "$OUT"/ppl.log
$S generate -m $M -ngl 99 -p "The capital of France is" -n 24 --temp 0 -t $T 2>&1 | tail -6

#!/usr/bin/env bash
# Issue 20's hybrid decode on the lent GPU machine (no Rust toolchain, no network, no zstd, at
# most 64 MiB of files per call with the repository's tracked files counted in). Made here and
# cut into call-sized folders by `bench/gpu/pieces.sh` (docs/gpu.md): the model (MODEL, default
# SmolLM2-135M-Instruct.Q4_1.gguf), gzipped: the stripped `sift`, the engine's GPU test binary
# (`gputest`), optionally MODEL's calibration (`<model>.calib.json`, for the threshold runs) and
# llama.cpp's sources (`llama-src.tar.gz`).
#   piece DIR: keeps DIR's pieces (the first call also prints the machine);
#   run DIR:   keeps the last pieces, joins every file (sha256 checked), starts llama.cpp's CUDA
#              build on CPUs 8-15, runs the engine's GPU tests, the transfer probe, and the decode
#              runs on CPUs 0-7: CPU, the layer split and every hybrid policy at GPU budgets of
#              25/50/75 % of the model (Top-K 0.5, and a calibrated threshold at 0.5), 256 tokens
#              on two prompts; then, once llama.cpp is built, `llama-bench -ngl N` and
#              `sift bench -ngl N` in turn. BREAKDOWN=1: a few hybrid runs for the time split of
#              a token only; NOBENCH=1: the tests only; VALIDATE=1: the simulator against the
#              engine (below).
set -u
stage=$1
dir=$2
keep=/tmp/sift
[ -e "$keep" ] || first=1
mkdir -p "$keep"
t0=$(date +%s)
nvrtc=$(find /usr/local/cuda*/ /opt -name 'libnvrtc.so*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=${nvrtc:+$(dirname "$nvrtc"):}${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -e /work/main/tests ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
cp -r "$dir"/* "$keep"/
if [ -n "${first:-}" ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
    lscpu | grep -E 'Model name|^CPU\(s\)'
    command -v cmake ninja nvcc
fi
if [ "$stage" = piece ]; then
    ls -la "$keep"
    exit 0
fi
# Join the pieces, check them, unpack.
for p0 in "$keep"/*.part00; do
    f=${p0%.part00}
    [ -e "$f" ] || cat "$f".part* > "$f"
done
(cd "$keep" && sha256sum -c sums) || { echo "a joined file does not match its sum" >&2; exit 1; }
for z in "$keep"/*.gz; do [ -e "${z%.gz}" ] || gzip -dc "$z" > "${z%.gz}"; done
chmod +x "$keep"/sift "$keep"/gputest "$keep"/sift-old 2>/dev/null
S=$keep/sift
MODEL=${MODEL:-SmolLM2-135M-Instruct.Q4_1.gguf}
M=models/$MODEL
P=models/${MODEL%.gguf}.sift
C=$keep/${MODEL%.gguf}.calib.json
T=${THREADS:-8}
N=${NGEN:-256}
mkdir -p models
[ -e $M ] || cp "$keep/$MODEL" $M
# llama.cpp with CUDA for this GPU, on the other eight CPUs meanwhile.
[ -e "$keep"/llama-src.tar.gz ] && mkdir -p /tmp/llama && (cd /tmp/llama && tar xzf "$keep"/llama-src.tar.gz)
setsid bash -c "cd /tmp/llama && cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX512=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  && taskset -c 8-15 cmake --build b --target llama-bench -j 8; echo build-rc \$?" >/tmp/llama.log 2>&1 &
pin="taskset -c 0-$((T - 1))"
[ -e $P ] || $pin $S pack $M -o $P 2>&1 | tail -1
# BREAKDOWN=1: only where a hybrid token's time goes (the hybrid line's per-token split), a few
# configurations, first prompt.
if [ -n "${BREAKDOWN:-}" ]; then
    [ -x "$keep"/gputest ] && timeout 90 "$keep"/gputest --nocapture --test-threads 1 hybrid 2>&1 | grep -E 'round|result'
    head -c 2000 tests/fixtures/wiki.test.head16k.raw | tail -c 1200 > /tmp/p1.txt
    runs=("--sparsity topk --ratio 0.5" "--sparsity topk --ratio 0.5 --gpu-memory 50% --gpu-policy static"
        "--sparsity topk --ratio 0.5 --gpu-memory 75% --gpu-policy static"
        "--sparsity topk --ratio 0.5 --gpu-memory 50% --gpu-policy tam-adaptive")
    [ -e $C ] && runs+=("--sparsity threshold --ratio 0.5 --calib $C --gpu-memory 50% --gpu-policy static")
    for args in "${runs[@]}"; do
        for t in ${THREADS_LIST:-8 2}; do
            echo "== sift generate -m $P -f /tmp/p1.txt -n $N --temp 0 --ignore-eos -t $t $args"
            taskset -c 0-$((t - 1)) $S generate -m $P -f /tmp/p1.txt -n $N --temp 0 --ignore-eos -t $t $args 2>&1 >/dev/null |
                grep -E 'eval time|hybrid ' | grep -v 'prompt eval'
        done
    done 2>&1 | tee "$OUT"/breakdown.log
    exit 0
fi
# VALIDATE=1: the simulator against the engine (issue 20): the GPU tests, `sift probe --gpu -m
# PACK` (the transfer curve and the engine's costs from six short calibration decodes), a CPU
# trace of the first prompt, `sift simulate --gpu` of it for every budget x policy, and the same
# runs for real; bench/gpu/validate.py puts predictions beside measurements.
if [ -n "${VALIDATE:-}" ]; then
    echo "== GPU tests ($(($(date +%s) - t0)) s)"
    timeout 120 $pin "$keep"/gputest --nocapture --test-threads 1 2>&1 | tee "$OUT"/engine.log | grep -E '^test |result|agree' | cut -c1-200 | tail -12
    head -c 2000 tests/fixtures/wiki.test.head16k.raw | tail -c 1200 > /tmp/p1.txt
    # A failed test leaves the earlier binary (sift-old, when it came) for the measurements.
    if [ -x "$keep"/gputest ] && ! grep -q '^test result: ok' "$OUT"/engine.log && [ -x "$keep"/sift-old ]; then
        echo "the GPU tests failed: measuring with sift-old"; S=$keep/sift-old
    fi
    echo "== probe and calibration ($(($(date +%s) - t0)) s)"
    $pin $S probe --gpu -m $P -t $T -o "$OUT"/gpu-probe.json 2>&1 | grep -v 'host to device' | tail -12
    echo "== trace and simulation ($(($(date +%s) - t0)) s)"
    rm -f /tmp/p1.trace
    $pin $S trace -m $P -p "$(cat /tmp/p1.txt)" -n $N --temp 0 --ignore-eos --sparsity topk --ratio 0.5 -c 1024 -t $T -o /tmp/p1.trace 2>&1 | tail -1
    budgets_csv=$(echo ${BUDGETS:-25% 50% 75%} | tr ' ' ,)
    for a in auto off; do
        $S simulate --trace /tmp/p1.trace -m $P --gpu "$OUT"/gpu-probe.json --gpu-memory $budgets_csv -c 1024 \
            --gpu-attention $a --gpu-policy layers,static,eager,lru,tam,tam-adaptive -o json > "$OUT"/sim-$a.json 2> /tmp/sim.err ||
            cat /tmp/sim.err
    done
    echo "== runs ($(($(date +%s) - t0)) s)"
    vrun() { # label, args...
        local label=$1; shift
        printf '== %s | %s\n' "$label" "$*" >> "$OUT"/validate.log
        $pin $S generate -m $P -p "$(cat /tmp/p1.txt)" -n $N -c 1024 --temp 0 --ignore-eos -t $T "$@" 2>&1 >/dev/null |
            grep -E 'eval time|hybrid|error|offloaded|attention' | grep -v 'prompt eval' >> "$OUT"/validate.log
    }
    for B in ${BUDGETS:-25% 50% 75%}; do
        vrun "layers $B auto" --gpu-memory $B
        for pol in static eager lru tam tam-adaptive; do
            vrun "$pol $B auto" --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol
        done
        for pol in static tam-adaptive; do
            vrun "$pol $B off" --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol --gpu-attention off
        done
        echo "   $B done ($(($(date +%s) - t0)) s)"
    done
    vrun "cpu-topk - -" --sparsity topk --ratio 0.5
    python3 bench/gpu/validate.py "$OUT"/validate.log "$OUT"/sim-auto.json "$OUT"/sim-off.json | tee "$OUT"/validate.md
    # AB=1 with sift-old beside sift: the two binaries alternately on a few configurations.
    if [ -n "${AB:-}" ] && [ -x "$keep"/sift-old ] && [ "$S" != "$keep"/sift-old ]; then
        echo "== A/B: sift-old against sift ($(($(date +%s) - t0)) s)"
        for args in "--gpu-memory 25% --gpu-policy static" "--gpu-memory 50% --gpu-policy static" \
            "--gpu-memory 50% --gpu-policy tam-adaptive" "--gpu-memory 75% --gpu-policy static"; do
            for round in 1 2; do
                for b in sift-old sift; do
                    r=$($pin "$keep"/$b generate -m $P -p "$(cat /tmp/p1.txt)" -n $N -c 1024 --temp 0 --ignore-eos -t $T \
                        --sparsity topk --ratio 0.5 $args 2>&1 >/dev/null | grep -E 'eval time|hybrid ' | grep -v 'prompt eval')
                    echo "$b | $args | round $round | $(echo "$r" | grep -oE '[0-9.]+ tokens per second') | $(echo "$r" | grep -oE 'per token [0-9.]+ ms queueing.*' | cut -c1-260)"
                done
            done
        done | tee "$OUT"/ab.log
    fi
    echo "== done ($(($(date +%s) - t0)) s)"
    exit 0
fi
# ATTENTION=1: KAIROX's placement (attention on the GPU, --gpu-attention) against the FFN-only
# hybrid at the same budgets, -c 1024 everywhere (the attention's KV cache is counted in), one
# pass; no llama.cpp. Figures written as they come (a cut-off call still brings them back).
# BUDGETS (default "50% 75% 25%"), EXTRA ("eager lru tam": more policies at 50 %, 8 threads),
# PROMPTS ("p1 p2") trim it for larger models.
[ -e "$keep"/SmolLM2-135M-Instruct.Q4_1.gguf ] && mkdir -p models && [ ! -e models/SmolLM2-135M-Instruct.Q4_1.gguf ] &&
    cp "$keep"/SmolLM2-135M-Instruct.Q4_1.gguf models/
if [ -n "${ATTENTION:-}" ]; then
    echo "== GPU tests ($(($(date +%s) - t0)) s)"
    timeout 200 $pin "$keep"/gputest --nocapture --test-threads 1 2>&1 | tee "$OUT"/engine.log | grep -E '^test |result|agree' | tail -24
    $pin $S probe --gpu -o "$OUT"/gpu-probe.json 2>&1 | tail -4
    head -c 2000 tests/fixtures/wiki.test.head16k.raw | tail -c 1200 > /tmp/p1.txt
    tail -c 1200 tests/fixtures/wiki.test.head16k.raw > /tmp/p2.txt
    arun() { # threads, label, args...: the full lines into attention.log, one line here
        local t=$1 label=$2; shift 2
        for p in ${PROMPTS:-p1 p2}; do
            p=/tmp/$p.txt
            local o
            o=$(taskset -c 0-$((t - 1)) $S generate -f $p -n $N -c 1024 --temp 0 --ignore-eos -t $t "$@" 2>&1 >/dev/null |
                grep -E 'eval time|hybrid |error|offloaded|attention' | grep -v 'prompt eval')
            printf '== %s -t %s | %s | %s\n%s\n' "$label" "$t" "$(basename $p)" "$*" "$o" >> "$OUT"/attention.log
            echo "$label -t $t $(basename $p): $(echo "$o" | grep -oE '[0-9.]+ tokens per second' | head -1) | $(echo "$o" | grep -oE 'hybrid .*' | grep -v '^hybrid decode' | head -1 | cut -c1-330) $(echo "$o" | grep -iE 'error' | head -1 | cut -c1-200)"
        done
    }
    echo "== runs ($(($(date +%s) - t0)) s)"
    for t in ${THREADS_LIST:-8 2}; do
        arun $t cpu-topk -m $P --sparsity topk --ratio 0.5
        for B in ${BUDGETS:-50% 75% 25%}; do
            [ $t = 8 ] || [ $B = 50% ] || continue
            arun $t "layers-dense $B" -m $M --gpu-memory $B
            for pol in static tam-adaptive; do
                for a in off auto; do
                    arun $t "hybrid $pol $B attention-$a" -m $P --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol --gpu-attention $a
                done
            done
            if [ $t = 8 ] && [ $B = 50% ]; then
                for pol in ${EXTRA-eager lru tam}; do
                    arun $t "hybrid $pol $B attention-auto" -m $P --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol
                done
            fi
        done
    done
    echo "== done ($(($(date +%s) - t0)) s)"
    exit 0
fi
echo "== GPU tests ($(($(date +%s) - t0)) s)"
timeout 150 $pin "$keep"/gputest --nocapture --test-threads 1 2>&1 | tee "$OUT"/engine.log | grep -E '^test |result|within|agree' | tail -12
[ -n "${NOBENCH:-}" ] && exit 0
$pin $S probe --gpu -o "$OUT"/gpu-probe.json 2>&1 | tail -9
head -c 2000 tests/fixtures/wiki.test.head16k.raw | tail -c 1200 > /tmp/p1.txt
tail -c 1200 tests/fixtures/wiki.test.head16k.raw > /tmp/p2.txt
run() { # label, args...
    local label=$1; shift
    for p in /tmp/p1.txt /tmp/p2.txt; do
        echo "== $label | sift generate -f $p -n $N --temp 0 --ignore-eos -t $T $*"
        $pin $S generate -f $p -n $N --temp 0 --ignore-eos -t $T "$@" 2>&1 >/dev/null |
            grep -E 'eval time|hybrid|error|offloaded|GPU' | grep -v 'prompt eval'
    done
}
echo "== hybrid runs ($(($(date +%s) - t0)) s)"
{
    run cpu-dense -m $M
    run cpu-topk -m $P --sparsity topk --ratio 0.5
    [ -e $C ] && run cpu-threshold -m $P --sparsity threshold --ratio 0.5 --calib $C
    for B in 25% 50% 75%; do
        run "layers-dense $B" -m $M --gpu-memory $B
        for pol in static eager lru tam tam-adaptive; do
            run "hybrid $pol $B" -m $P --sparsity topk --ratio 0.5 --gpu-memory $B --gpu-policy $pol
        done
        [ -e $C ] && for pol in static tam-adaptive; do
            run "hybrid-threshold $pol $B" -m $P --sparsity threshold --ratio 0.5 --calib $C --gpu-memory $B --gpu-policy $pol
        done
    done
} > "$OUT"/hybrid.log 2>&1
grep -E '^==|eval time' "$OUT"/hybrid.log | grep -B1 'eval time' | grep -v '^--' | paste - - | sed -E 's/\| sift generate.*eval time//' | cut -c1-150
echo "== llama.cpp build ($(($(date +%s) - t0)) s)"
while ! grep -q build-rc /tmp/llama.log && [ $(($(date +%s) - t0)) -lt 500 ]; do sleep 5; done
tail -3 /tmp/llama.log; cp /tmp/llama.log "$OUT"/llama-build.log
L=/tmp/llama/b/bin/llama-bench
echo "== -ngl in the same run ($(($(date +%s) - t0)) s)"
{
    for ngl in 0 9 18 27 99; do
        [ -x $L ] && $pin $L -m $M -p 512 -n 256 -ngl $ngl -t $T -r 3 2>&1 | grep -E '^\|' | tail -2
        $pin $S bench -m $M -p 512 -n 256 -ngl $ngl -t $T -r 3 2>&1 | grep -E '^\|' | tail -2
    done
} 2>&1 | tee "$OUT"/ngl.log
$pin $S probe --quick -m $M 2>&1 | grep -iE 'dram|memory|disk|read' | head -4
echo "== done ($(($(date +%s) - t0)) s)"

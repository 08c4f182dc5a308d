#!/bin/sh
# Simulated seed devices next to the seeds' own claims (issue 5), on a trace of Qwen2.5-1.5B.
#   sh bench/seed_devices.sh TRACE PACK OUTDIR
# Needs target/release/sift. Each line is one `sift simulate` call; results land in OUTDIR/*.json.
set -eu
T=$1; M=$2; O=$3
S=target/release/sift
mkdir -p "$O"
sim() { name=$1; shift; $S simulate --trace "$T" -m "$M" -c 512 -o json "$@" > "$O/$name.json"; }
# ActiveFlow (§7.2): full weights in memory (dense, everything cached) vs 60% and 25% memory with
# Top-K sparsity and cross-layer groups of 4, on each phone.
for d in activeflow-oneplus12 activeflow-pixel6 activeflow-infinix-zero30; do
  sim "$d-dense-full" --profile $d --memory 250% --sparsity dense --policy lfu --preload 0
  sim "$d-topk" --profile $d --memory 60%,75%,100% --sparsity topk --ratio 0.5 --policy lfu --preload 4
done
# DIP (Fig. 11, A18 setting, about half the model in DRAM): LFU vs LRU vs Belady under DIP, and
# DIP-CA with LFU.
sim dip-policies --profile dip-a18 --memory 50% --sparsity dip --ratio 0.5 --policy lfu,lru,belady
sim dip-ca --profile dip-a18 --memory 50% --sparsity dip-ca --ratio 0.5 --gamma 0.2 --policy lfu
# Policy comparison on this machine: hit rate and tok/s vs cache size, Belady and DIP-CA included.
$S simulate --trace "$T" -m "$M" -c 512 --profile sift-dev-2core \
  --memory 45%,55%,65%,80%,100%,120% --policy lfu,lru,tam,belady,static --sparsity recorded \
  --sweep "$O/policies" > "$O/policies.md"
$S simulate --trace "$T" -m "$M" -c 512 --profile sift-dev-2core \
  --memory 45%,55%,65%,80%,100%,120% --policy lfu,lru,tam,belady,static --sparsity dip,dip-ca --ratio 0.5 \
  --sweep "$O/dip" > "$O/dip.md"

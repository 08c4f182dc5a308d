#!/usr/bin/env bash
# Builds the llama.cpp reference used to make test fixtures and to benchmark against.
# Not part of CI (takes ~15-20 min on 2 cores). Usage: scripts/build-llama-ref.sh [DIR] (default .ref)
#
# - llama.cpp tools (llama-bench, llama-perplexity, llama-tokenize, llama-cli) are built from the
#   llama.cpp sources vendored in the llama-cpp-python sdist, so both come from one version.
# - llama-cpp-python is installed into DIR/venv without building llama.cpp a second time; it is
#   pointed at the shared libraries built above through LLAMA_CPP_LIB_PATH (see scripts/ref-env.sh).
# AVX-512 + VNNI where the CPU has them (AVX2 otherwise), never -march=native: one of the
# project's VMs reports AMX but its instructions SIGILL.
set -euo pipefail
ver=0.3.36
dir=$(realpath -m "${1:-.ref}")
mkdir -p "$dir"
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet cmake ninja numpy
if [ ! -d "$dir/src" ]; then
  "$dir/venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python -d "$dir/dl" "llama-cpp-python==$ver"
  mkdir -p "$dir/src" && tar -xzf "$dir/dl/llama_cpp_python-$ver.tar.gz" -C "$dir/src" --strip-components=1
fi
export PATH="$dir/venv/bin:$PATH"
avx512="-DGGML_AVX512=OFF"
if grep -qw avx512f /proc/cpuinfo; then avx512="-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON"; fi
# shellcheck disable=SC2086 # $avx512 is a list of flags
cmake -S "$dir/src/vendor/llama.cpp" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF $avx512 -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=ON
cmake --build "$dir/build" -j 2 --target llama-bench llama-perplexity llama-tokenize llama-completion llama-server
CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$dir/venv/bin/pip" install --quiet --no-deps "$dir/dl/llama_cpp_python-$ver.tar.gz" \
  || CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$dir/venv/bin/pip" install --quiet --no-deps "$dir/src"
"$dir/venv/bin/pip" install --quiet typing-extensions diskcache jinja2
echo "reference built in $dir: tools in $dir/build/bin, python in $dir/venv (source scripts/ref-env.sh)"

# Source this to use the llama.cpp reference built by scripts/build-llama-ref.sh:
#   . scripts/ref-env.sh   →  llama-bench, llama-perplexity on PATH; python = llama-cpp-python venv
_ref="$(realpath -m "$(dirname "${BASH_SOURCE[0]}")/../.ref")"
export LLAMA_CPP_LIB_PATH="$_ref/build/bin"
export LD_LIBRARY_PATH="$_ref/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$_ref/build/bin:$_ref/venv/bin:$PATH"

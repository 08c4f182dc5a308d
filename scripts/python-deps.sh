#!/usr/bin/env bash
# Installs the Python packages the tests drive sift with (the official `openai` client, for
# crates/cli/tests/serve.rs -> tests/serve_openai.py) into target/python, unless python3 already
# has them. Idempotent; needs python3 with pip and the Python package registry (as fetch-model.sh).
# The tests put target/python on PYTHONPATH.
set -euo pipefail
dest="$(cd "$(dirname "$0")/.." && pwd)/target/python"
if PYTHONPATH="$dest${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import openai" 2>/dev/null; then exit 0; fi
echo "installing the openai Python package into $dest..." >&2
python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --target "$dest" "openai>=1.0,<4"
PYTHONPATH="$dest" python3 -c "import openai"

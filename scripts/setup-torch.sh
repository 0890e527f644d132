#!/usr/bin/env bash
# setup-torch.sh: PyTorch + transformers in a venv outside the repo, for
# regenerating the golden fixtures (tests/reference/make_golden.py) and for the
# side-by-side benchmark (bench/train_throughput.sh). Never needed by CI or tests.
#
#   bash scripts/setup-torch.sh            # venv at /opt/keel-torch
#   KEEL_TORCH_VENV=DIR bash scripts/setup-torch.sh
#
# Idempotent: a venv that already imports torch, transformers and safetensors
# is left as it is. PyPI's torch wheel pulls the CUDA libraries (a few GB of
# download) even though only the CPU is used here; that is expected.
set -euo pipefail

venv="${KEEL_TORCH_VENV:-/opt/keel-torch}"
# Debian's interpreter, not a pyenv shim that may not exist on the next machine.
python="${KEEL_TORCH_PYTHON:-/usr/bin/python3}"
[ -x "$python" ] || python="$(command -v python3)"

check() {
    "$venv/bin/python" - <<'EOF' 2>/dev/null
import torch, transformers, safetensors
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"safetensors {safetensors.__version__}")
EOF
}

if [ -x "$venv/bin/python" ] && check; then
    echo "setup-torch: $venv is ready"
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        echo "setup-torch: '$python -m venv' failed; installing python3-venv" >&2
        apt-get install -y python3-venv >/dev/null
        "$python" -m venv "$venv"
    fi
fi
"$venv/bin/pip" install --upgrade pip >/dev/null
"$venv/bin/pip" install torch transformers safetensors
check || { echo "setup-torch: $venv was built but cannot import torch/transformers" >&2; exit 1; }
echo "setup-torch: $venv is ready"

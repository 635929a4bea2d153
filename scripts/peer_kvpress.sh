#!/usr/bin/env bash
# Build .peers/kvpress: NVIDIA's kvpress (pip `kvpress`) as the KV-compression peer for
# scripts/kvpress_compare.py (docs/kv_compression_peer.md).
#
# kvpress 0.5.5 asks for torch >=2.3.1,<3 and transformers >=4.56,<5.3; .venv has
# transformers 5.24, so the peer gets its own environment (pip settles on transformers 5.2.x).
# Steps:
#   1. python3.11 -m venv .peers/kvpress
#   2. pip install kvpress==0.5.5 torch==2.13.0 (naming torch keeps pip on the local CPU
#      build; any other version pulls a multi-GB CUDA one)
#   3. verify: kvpress imports with the four presses the comparison uses, torch is 2.13.0
#      without CUDA; print the versions
# Nothing is downloaded from a model hub: the comparison loads our local model folder.
# Idempotent: an existing .peers/kvpress that passes step 3 is kept (FORCE=1 rebuilds it).
# CHECK=1 only runs step 3 and refuses in one line when the peer is missing or broken.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVPRESS_VENV:-$ROOT/.peers/kvpress}"
PY="${PYTHON:-python3.11}"
KVPRESS_VERSION="${KVPRESS_VERSION:-0.5.5}"
TORCH_VERSION="2.13.0"

verify() {
    "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import transformers
from kvpress import ObservedAttentionPress, PyramidKVPress, SnapKVPress, StreamingLLMPress  # noqa: F401

assert torch.__version__.startswith("2.13.0") and not torch.version.cuda, torch.__version__
print(f"kvpress {md.version('kvpress')}, transformers {transformers.__version__}, "
      f"torch {torch.__version__}")
EOF
}

if [[ "${CHECK:-0}" == "1" ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "peer-kvpress: $VENV is missing; build it with \`make peer-kvpress\`" >&2
        exit 2
    fi
    verify 2>/dev/null || { echo "peer-kvpress: $VENV does not import kvpress; rebuild it with \`FORCE=1 make peer-kvpress\`" >&2; exit 1; }
    exit 0
fi

if [[ "${FORCE:-0}" != "1" && -x "$VENV/bin/python" ]] && verify 2>/dev/null; then
    echo "peer-kvpress: $VENV already built"
    exit 0
fi

command -v "$PY" >/dev/null || { echo "peer-kvpress: $PY not found (set PYTHON=...)" >&2; exit 1; }
start=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet "pip>=25"
"$VENV/bin/pip" install "kvpress==$KVPRESS_VERSION" "torch==$TORCH_VERSION"
verify || { echo "peer-kvpress: FAILED: $VENV cannot import kvpress (see above)" >&2; exit 1; }
echo "peer-kvpress: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"

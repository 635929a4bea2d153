#!/usr/bin/env bash
# Build .peers/vidur: Vidur (pip `vidur`, microsoft/vidur) as the simulator's peer for
# scripts/vidur_compare.py (docs/simulator_vidur.md).
#
# Vidur's wheel ships no operator profiles: it reads data/profiling/compute/<device>/<model>/
# {mlp,attention}.csv and data/profiling/network/<network device>/{all_reduce,send_recv}.csv
# from a checkout. This machine reaches package registries only, so the data comes from the
# user: VIDUR_DATA=/path/to/vidur/data, the data/ folder of
#   git clone https://github.com/microsoft/vidur
# Steps:
#   1. refuse in one line unless VIDUR_DATA holds the files the comparison reads
#      (VIDUR_DEVICES, default "a100": Llama-2-7B's compute profiles, the pairwise-NVLink
#      network profiles)
#   2. python3.11 -m venv .peers/vidur; pip install vidur==0.0.26 (numpy, pandas,
#      scikit-learn, wandb, plotly, ... come as its dependencies)
#   3. verify: `python -m vidur.main -h` parses its config; record VIDUR_DATA's absolute path
#      in .peers/vidur/VIDUR_DATA (scripts/vidur_compare.py reads it)
# Idempotent: an existing .peers/vidur that passes step 3 is kept (FORCE=1 rebuilds it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VIDUR_VENV:-$ROOT/.peers/vidur}"
PY="${PYTHON:-python3.11}"
VIDUR_VERSION="${VIDUR_VERSION:-0.0.26}"
MODEL="meta-llama/Llama-2-7b-hf"
DATA="${VIDUR_DATA:-}"
HOW="the data/ folder of a git clone of microsoft/vidur (docs/simulator_vidur.md)"

if [[ -z "$DATA" ]]; then
    echo "peer-vidur: set VIDUR_DATA=/path/to/vidur/data, $HOW; Vidur's wheel has no profiles" >&2
    exit 2
fi
missing=()
for dev in ${VIDUR_DEVICES:-a100}; do
    for f in "compute/$dev/$MODEL/mlp.csv" "compute/$dev/$MODEL/attention.csv" \
             "network/${dev}_pairwise_nvlink/all_reduce.csv" \
             "network/${dev}_pairwise_nvlink/send_recv.csv"; do
        [[ -s "$DATA/profiling/$f" ]] || missing+=("profiling/$f")
    done
done
if (( ${#missing[@]} )); then
    echo "peer-vidur: VIDUR_DATA ($DATA) lacks ${missing[*]}; it must be $HOW" >&2
    exit 2
fi
DATA="$(cd "$DATA" && pwd)"

verify() {
    WANDB_MODE=disabled "$VENV/bin/python" -m vidur.main -h >/dev/null \
        && "$VENV/bin/python" -c "import importlib.metadata as m; print('vidur', m.version('vidur'))"
}

if [[ "${FORCE:-0}" != "1" && -x "$VENV/bin/python" ]] && verify 2>/dev/null; then
    echo "$DATA" > "$VENV/VIDUR_DATA"
    echo "peer-vidur: $VENV already built; VIDUR_DATA=$DATA"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet "pip>=25"
"$VENV/bin/pip" install "vidur==$VIDUR_VERSION"
verify || { echo "peer-vidur: FAILED: $VENV cannot run python -m vidur.main (see above)" >&2; exit 1; }
echo "$DATA" > "$VENV/VIDUR_DATA"
echo "peer-vidur: built $VENV in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1); VIDUR_DATA=$DATA"

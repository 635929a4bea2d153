"""Vidur's operator profiles: where a checkout keeps them, and how vidur 0.0.26 is given them
without a network.

A microsoft/vidur checkout's `data/` holds, per GPU and model (PROFILE_FILES):

    profiling/compute/<device>/<model>/{mlp,attention}.csv
    profiling/network/<network device>/{all_reduce,send_recv}.csv

vidur 0.0.26 (pip) reads no such folder: its predictors `snapshot_download` two Hugging Face
datasets (`*_model_profiling_dataset`, `*_network_profiling_dataset`, default
project-vajra/dev-staging-meta-llama-llama-3-8b-h100 and project-vajra/dev-staging-h100-dgx)
into `<cache_dir>/profiling_data/{compute,network}/` and read `mlp.csv.xz`,
`attention.csv.xz`, `all_reduce.csv.xz`, `send_recv.csv.xz` and a `config.json` naming the
model and device (compute) or the network device (network). `stage_profiles` writes a
checkout's files into that cache in the hub's layout (`datasets--<org>--<name>/refs/main` and
`snapshots/<rev>/`) under the dataset names `dataset_names` gives, so Vidur run with
HF_HUB_OFFLINE=1 finds them locally and never reaches for the network.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Protocol

PROFILE_FILES = ("compute", "attention", "all_reduce", "send_recv")
LOCAL_ORG = "workbench-local"  # the staged datasets' owner: never a real hub organisation
LOCAL_REVISION = "local"


class _Target(Protocol):
    @property
    def vidur_model(self) -> str: ...
    @property
    def vidur_device(self) -> str: ...
    @property
    def vidur_network_device(self) -> str: ...


def profile_files(cfg: _Target, data_dir: Path) -> dict[str, Path]:
    """The checkout's profiling files for this model and GPU (keys: PROFILE_FILES)."""
    compute = data_dir / "profiling" / "compute" / cfg.vidur_device / cfg.vidur_model
    network = data_dir / "profiling" / "network" / cfg.vidur_network_device
    return {"compute": compute / "mlp.csv", "attention": compute / "attention.csv",
            "all_reduce": network / "all_reduce.csv", "send_recv": network / "send_recv.csv"}


def missing_profile_files(cfg: _Target, data_dir: Path) -> list[Path]:
    return [p for p in profile_files(cfg, data_dir).values() if not p.is_file()]


def dataset_names(cfg: _Target) -> tuple[str, str]:
    """The (compute, network) dataset ids the staged profiles go by."""
    model = cfg.vidur_model.replace("/", "-").lower()
    return (f"{LOCAL_ORG}/vidur-{model}-{cfg.vidur_device}",
            f"{LOCAL_ORG}/vidur-{cfg.vidur_network_device}")


def _snapshot(cache_dir: Path, kind: str, dataset: str) -> Path:
    folder = cache_dir / "profiling_data" / kind / f"datasets--{dataset.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(LOCAL_REVISION)
    snap = folder / "snapshots" / LOCAL_REVISION
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def stage_profiles(cfg: _Target, data_dir: Path, cache_dir: Path) -> tuple[Path, Path]:
    """Write the checkout's four files, xz-compressed, with each dataset's config.json, into
    Vidur's cache; the (compute, network) snapshot folders. Missing files: FileNotFoundError
    naming them."""
    missing = missing_profile_files(cfg, data_dir)
    if missing:
        raise FileNotFoundError(f"Vidur profiling data missing: {', '.join(map(str, missing))}")
    files = profile_files(cfg, data_dir)
    compute_name, network_name = dataset_names(cfg)
    compute = _snapshot(cache_dir, "compute", compute_name)
    network = _snapshot(cache_dir, "network", network_name)
    (compute / "config.json").write_text(json.dumps(
        {"model": cfg.vidur_model, "device_sku": cfg.vidur_device}))
    (network / "config.json").write_text(json.dumps({"sku": cfg.vidur_network_device}))
    for folder, name, key in ((compute, "mlp", "compute"), (compute, "attention", "attention"),
                              (network, "all_reduce", "all_reduce"),
                              (network, "send_recv", "send_recv")):
        (folder / f"{name}.csv.xz").write_bytes(lzma.compress(files[key].read_bytes()))
    return compute, network

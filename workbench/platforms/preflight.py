"""Preflight: the hardware/software contract a measurement ran under (seed 001, step 1).

    workbench preflight [--json] [--out FILE] [--compare OLD.json]
    python -m workbench.platforms.preflight ...

`collect_preflight()` records CPU (model, cores, memory, AVX2/AVX-512/AMX), GPUs (nvidia-smi,
else pynvml, else None), python/torch/triton/transformers/vllm versions, the git sha and dirty
flag, and the hostname. `fingerprint` is a short sha256 over only the fields that change what a
run measures (GPU name/count/driver, or CPU model/cores without a GPU; torch, its CUDA,
triton, transformers): the git sha and hostname are left out, so two runs of different code on
equal machines compare. `compare_fingerprints(a, b)` names the fields that differ.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

NVIDIA_SMI_FIELDS = (
    "name", "uuid", "memory.total", "driver_version", "power.limit", "clocks.max.sm", "clocks.sm"
)
NVIDIA_SMI_CMD = [
    "nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"
]
SOFTWARE = ("torch", "triton", "transformers", "vllm")
REPO_DIR = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ parsers (pure, testable)
def _number(text: str) -> float | None:
    """'143771 MiB' -> 143771.0, '700.00 W' -> 700.0, '[N/A]' / '[Not Supported]' -> None."""
    head = text.strip().split(" ")[0]
    try:
        return float(head)
    except ValueError:
        return None


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def parse_nvidia_smi_csv(text: str) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader[,nounits]`."""
    gpus = []
    for row in csv.reader(text.strip().splitlines(), skipinitialspace=True):
        if not row:
            continue
        if len(row) != len(NVIDIA_SMI_FIELDS):
            raise ValueError(
                f"nvidia-smi line has {len(row)} fields, expected {len(NVIDIA_SMI_FIELDS)} "
                f"({', '.join(NVIDIA_SMI_FIELDS)}): {row!r}"
            )
        name, uuid, mem, driver, power, max_sm, sm = (c.strip() for c in row)
        gpus.append({
            "name": name,
            "uuid": uuid,
            "memory_total_mib": _int_or_none(_number(mem)),
            "driver_version": driver,
            "power_limit_w": _number(power),
            "clocks_max_sm_mhz": _int_or_none(_number(max_sm)),
            "clocks_sm_mhz": _int_or_none(_number(sm)),
        })
    return gpus


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model name and the flags of interest from /proc/cpuinfo text (x86 `flags`, Arm
    `Features`)."""
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    amx = sorted(f for f in flags if f.startswith("amx"))
    return {
        "model": model,
        "flags": {"avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "amx": bool(amx)},
        "amx_flags": amx,
    }


def parse_meminfo_bytes(text: str) -> int | None:
    """MemTotal from /proc/meminfo text, in bytes."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


# ------------------------------------------------------------------ collectors
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def collect_cpu() -> dict[str, Any]:
    info = parse_cpuinfo(_read("/proc/cpuinfo"))
    memory = parse_meminfo_bytes(_read("/proc/meminfo"))
    if memory is None:
        try:
            import psutil

            memory = int(psutil.virtual_memory().total)
        except ImportError:
            memory = None
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "model": info["model"] or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": memory,
        "flags": info["flags"],
        "amx_flags": info["amx_flags"],
    }


def _gpus_from_pynvml() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # optional: GPU machines only, no stubs
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: no GPU to record
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "name": str(pynvml.nvmlDeviceGetName(h)),
                "uuid": str(pynvml.nvmlDeviceGetUUID(h)),
                "memory_total_mib": int(pynvml.nvmlDeviceGetMemoryInfo(h).total) >> 20,
                "driver_version": str(driver),
                "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
                "clocks_max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "clocks_sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            })
        return gpus or None
    finally:
        pynvml.nvmlShutdown()


def collect_gpus() -> list[dict[str, Any]] | None:
    """GPUs from nvidia-smi when it is on PATH, else pynvml when importable, else None."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(NVIDIA_SMI_CMD, capture_output=True, text=True, timeout=20)
            if out.returncode == 0:
                return parse_nvidia_smi_csv(out.stdout) or None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    return _gpus_from_pynvml()


def collect_software() -> dict[str, str | None]:
    """python and package versions; None for a package that is not importable."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in SOFTWARE:
        version = None
        if importlib.util.find_spec(name) is not None:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = "unknown"
        versions[name] = version
    versions["torch_cuda"] = None
    if versions["torch"] is not None:
        try:
            import torch

            versions["torch_cuda"] = torch.version.cuda
        except Exception:  # a broken torch install still gets its version recorded
            pass
    return versions


def collect_git(repo_dir: Path = REPO_DIR) -> dict[str, Any] | None:
    """HEAD sha and whether tracked files differ from it; None outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "--no-optional-locks", *args], cwd=repo_dir,
                              capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = None if status.returncode != 0 else bool(status.stdout.strip())
    return {"sha": head.stdout.strip(), "dirty": dirty}


# ------------------------------------------------------------------ record and fingerprint
def fingerprint_fields(record: dict[str, Any]) -> dict[str, Any]:
    """What must match for two runs to compare: the device, then the software stack."""
    gpus = record.get("gpu") or []
    if gpus:
        fields: dict[str, Any] = {
            "gpu_name": " + ".join(sorted({g.get("name") or "?" for g in gpus})),
            "gpu_count": len(gpus),
            "gpu_driver": gpus[0].get("driver_version"),
        }
    else:
        cpu = record.get("cpu") or {}
        fields = {key: cpu.get(k) for key, k in (("cpu_model", "model"),
                  ("cpu_logical_cores", "logical_cores"), ("cpu_usable_cores", "usable_cores"))}
    software = record.get("software") or {}
    fields.update({k: software.get(k) for k in ("torch", "torch_cuda", "triton", "transformers")})
    return fields


def fingerprint(record: dict[str, Any]) -> str:
    """sha256 over `fingerprint_fields`, first 12 hex digits."""
    blob = json.dumps(fingerprint_fields(record), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def collect_preflight(repo_dir: Path = REPO_DIR) -> dict[str, Any]:
    record: dict[str, Any] = {
        "collected_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": collect_cpu(),
        "gpu": collect_gpus(),
        "software": collect_software(),
        "git": collect_git(repo_dir),
    }
    record["git_sha"] = record["git"] and record["git"]["sha"]  # flat copies for run tags
    record["git_dirty"] = record["git"] and record["git"]["dirty"]
    record["fingerprint_fields"] = fingerprint_fields(record)
    record["fingerprint"] = fingerprint(record)
    return record


def compare_fingerprints(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One warning per fingerprint field that differs between two preflight records (recomputed
    from the records, so an edited or older record is judged by its contents); [] when equal."""
    fa, fb = fingerprint_fields(a), fingerprint_fields(b)
    warnings = [
        f"{key} differs: {fa.get(key)!r} vs {fb.get(key)!r}; the runs are not directly comparable"
        for key in sorted(fa.keys() | fb.keys(), key=lambda k: (k not in fa, k))
        if fa.get(key) != fb.get(key)
    ]
    stored = (a.get("fingerprint"), b.get("fingerprint"))
    if not warnings and None not in stored and stored[0] != stored[1]:
        warnings.append(f"stored fingerprints differ ({stored[0]} vs {stored[1]}) though the "
                        "compared fields match: were they written by another preflight version?")
    return warnings


# ------------------------------------------------------------------ command line
def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in _flatten(v, f"{prefix}{k}.")]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [row for i, v in enumerate(value) for row in _flatten(v, f"{prefix[:-1]}[{i}].")]
    return [(prefix[:-1], json.dumps(value) if isinstance(value, list | None) else str(value))]


def format_table(record: dict[str, Any]) -> str:
    rows = _flatten(record)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="workbench preflight", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the record as JSON")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON record here")
    ap.add_argument("--compare", type=Path, default=None,
                    help="a saved record: print what differs from this machine")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    record = collect_preflight()
    text = json.dumps(record, indent=2)
    print(text if args.json else format_table(record))
    if args.out is not None:
        args.out.write_text(text + "\n")
    if args.compare is not None:
        warnings = compare_fingerprints(json.loads(args.compare.read_text()), record)
        for w in warnings:
            print(f"WARNING: {w}", file=sys.stderr)
        if not warnings:
            print(f"comparable with {args.compare} (fingerprint {record['fingerprint']})",
                  file=sys.stderr)


if __name__ == "__main__":
    main()

"""The C++ CPU kernels' build identity: one build per (CPU, sources, flags, torch install)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.cpu import build, kernel_status
from tests.kernels.cpu_kernels import load_or_skip


def test_build_key_changes_with_every_input() -> None:
    key = build.build_key(["int f() { return 1; }"], ["-O3"], ["-fopenmp"])
    assert re.fullmatch(r"[0-9a-f]{8}_[0-9a-f]{10}", key)
    assert key.startswith(build.cpu_tag() + "_")
    assert build.build_key(["int f() { return 1; }"], ["-O3"], ["-fopenmp"]) == key
    others = {
        build.build_key(["int f() { return 2; }"], ["-O3"], ["-fopenmp"]),  # one source byte
        build.build_key(["int f() { return 1; }"], ["-O2"], ["-fopenmp"]),  # a compiler flag
        build.build_key(["int f() { return 1; }"], ["-O3"], []),  # a linker flag
        build.build_key(["int f() { return 1; }", ""], ["-O3"], ["-fopenmp"]),  # a source file
        build.build_key(["int f() { return 1; }"], [], ["-O3", "-fopenmp"]),  # flag moved
    }
    assert key not in others and len(others) == 5


def test_status_names_the_build_or_the_fallback(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    src = tmp_path / "k.cpp"
    src.write_text("// nothing\n")
    ext = build.CpuExtension("probe", [src])
    assert ext.status() == "not loaded"
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", "0")
    assert ext.load() is None
    assert ext.status() == "torch fallback (disabled by WORKBENCH_CPU_KERNELS=0)"
    assert set(kernel_status()) == {"paged_decode", "rotary", "rms_norm"}


def test_loaded_kernel_is_named_by_its_sources() -> None:
    from kernels.cpu import rotary

    load_or_skip(rotary.EXTENSION)
    src = Path(rotary.__file__).with_name("rotary.cpp").read_text()
    key = build.build_key([src], build.CFLAGS + ["-ffp-contract=off"], build.LDFLAGS)
    assert rotary.EXTENSION.status() == f"workbench_rotary_{key}"
    assert kernel_status()["rotary"] == f"workbench_rotary_{key}"
    # torch's load_inline extends the flag lists it is given: ours must stay as written
    assert build.LDFLAGS == ["-fopenmp"]
    assert rotary.EXTENSION.cflags == build.CFLAGS + ["-ffp-contract=off"]


def test_a_killed_builds_lock_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    from kernels.cpu.build import STALE_LOCK_S, clear_stale_lock

    lock = tmp_path / "lock"
    assert clear_stale_lock(tmp_path) is False  # no lock: nothing to do
    lock.touch()
    mtime = lock.stat().st_mtime
    assert clear_stale_lock(tmp_path, now=mtime + STALE_LOCK_S) is False  # a build in progress
    assert lock.exists()
    assert clear_stale_lock(tmp_path, now=mtime + STALE_LOCK_S + 1) is True
    assert not lock.exists()


def test_an_unknown_isa_falls_back_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_CPU_ISA", "avx3")
    ext = build.CpuExtension("never_built", [Path("nothing.cpp")])
    assert ext.load() is None
    assert ext.unavailable_reason() == "WORKBENCH_CPU_ISA='avx3' is not one of avx2, native"
    assert ext.status() == (
        "torch fallback (WORKBENCH_CPU_ISA='avx3' is not one of avx2, native)")


def test_the_isa_limit_is_named_beside_every_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.bench.micro.roofline import ISA_LIMIT_VARS, cpu_summary

    for var in ISA_LIMIT_VARS:
        monkeypatch.delenv(var, raising=False)
    assert "code paths limited" not in cpu_summary()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("WORKBENCH_CPU_ISA", "avx2")
    assert cpu_summary().endswith(
        "(code paths limited: ONEDNN_MAX_CPU_ISA=AVX2 WORKBENCH_CPU_ISA=avx2)")

"""Huge pages for the engine's large CPU buffers (workbench.worker.hugepages): the kernel's THP
mode read from sysfs, MADV_HUGEPAGE on the KV cache before its first touch (checked in the
VMA's flags), THP_MEM_ALLOC_ENABLE set for torch only when it can still take effect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.worker import hugepages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "mode"), [
    ("always [madvise] never\n", "madvise"),
    ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"),
    ("garbled\n", "unavailable"),
])
def test_thp_mode_is_read_from_sysfs(tmp_path: Path, text: str, mode: str) -> None:
    f = tmp_path / "enabled"
    f.write_text(text)
    assert hugepages.thp_mode(f) == mode
    assert hugepages.thp_mode(tmp_path / "missing") == "unavailable"


def vm_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping holding `addr` in this process."""
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = lo <= addr < hi
        elif head == "VmFlags:" and current:
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_kv_cache_buffers_are_marked_before_their_first_touch_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (2, 128, 16, 4, 64)  # 4 MiB of fp32: whole 2 MB pages inside, whatever its offset
    monkeypatch.setenv("WORKBENCH_HUGEPAGES", "all")
    t = hugepages.zeros(shape, torch.float32, "cpu")
    assert t.shape == shape and t.dtype == torch.float32 and not t.any()
    middle = t.data_ptr() + t.numel() * t.element_size() // 2
    assert "hg" in vm_flags(middle)  # MADV_HUGEPAGE landed on the buffer's pages
    small = torch.empty(1000)  # under 2 MB: nothing to gain, left alone
    assert hugepages.advise(small) is False
    advised: list[torch.Tensor] = []
    monkeypatch.setattr(hugepages, "advise", advised.append)
    for value in ("0", "1"):  # off, and the default: torch's allocations only
        monkeypatch.setenv("WORKBENCH_HUGEPAGES", value)
        off = hugepages.zeros(shape, torch.float32, "cpu")
        assert not off.any() and off.shape == shape
    assert advised == []  # the KV cache is not marked (torch's allocator may mark it itself)


def test_a_bad_setting_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_HUGEPAGES", "yes")
    with pytest.raises(ValueError, match=r"WORKBENCH_HUGEPAGES \('yes'\) must be one of "
                                         r"0, 1, all"):
        hugepages.setting()
    monkeypatch.setenv("WORKBENCH_HUGEPAGES", "ALL")
    assert hugepages.setting() == "all" and hugepages.kv_enabled()


def run_python(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("THP_MEM_ALLOC_ENABLE", "WORKBENCH_HUGEPAGES")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**base, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


SHOW = "import os; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"


def test_import_workbench_first_turns_on_torchs_huge_pages() -> None:
    assert run_python(f"import workbench; {SHOW}") == "1"
    # torch first: too late for torch's allocator, so it is not pretended
    assert run_python(f"import torch, workbench; {SHOW}") == "None"
    assert run_python(f"import workbench; {SHOW}", WORKBENCH_HUGEPAGES="0") == "None"
    assert run_python(f"import workbench; {SHOW}", THP_MEM_ALLOC_ENABLE="0") == "0"


def test_status_says_what_this_process_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "madvise")
    monkeypatch.delenv("WORKBENCH_HUGEPAGES", raising=False)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    assert hugepages.status() == "huge pages: torch allocations >= 2 MB (THP_MEM_ALLOC_ENABLE=1)"
    monkeypatch.setenv("WORKBENCH_HUGEPAGES", "all")
    assert hugepages.status() == (
        "huge pages: KV cache + torch allocations >= 2 MB (THP_MEM_ALLOC_ENABLE=1)")
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE")
    assert hugepages.status() == "huge pages: KV cache"
    monkeypatch.delenv("WORKBENCH_HUGEPAGES")
    assert hugepages.status().startswith("huge pages: none (torch was imported before")
    monkeypatch.setattr(hugepages, "thp_mode", lambda: "never")
    assert hugepages.status() == "huge pages unavailable (kernel THP never)"
    monkeypatch.setenv("WORKBENCH_HUGEPAGES", "0")
    assert hugepages.status() == "huge pages off (WORKBENCH_HUGEPAGES=0; kernel THP never)"

"""workbench.platforms.preflight: the hardware/software record, its fingerprint and comparison
(seed 001: fix the hardware contract before measuring, record runtime versions beside every
result)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from workbench.platforms import preflight
from workbench.platforms.preflight import (
    collect_preflight,
    compare_fingerprints,
    fingerprint,
    parse_cpuinfo,
    parse_meminfo_bytes,
    parse_nvidia_smi_csv,
)

H200_LINE = (
    "NVIDIA H200, GPU-5c1d3e7a-0b2f-4c1d-9e8f-0123456789ab, 143771 MiB, 570.133.20, "
    "700.00 W, 1980 MHz, 345 MHz\n"
)


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return collect_preflight()


def test_record_has_the_contract_keys_and_types(record: dict[str, Any]) -> None:
    assert {"hostname", "cpu", "gpu", "software", "git", "fingerprint"} <= record.keys()
    cpu = record["cpu"]
    assert isinstance(cpu["model"], str) and cpu["model"]
    assert isinstance(cpu["logical_cores"], int) and cpu["logical_cores"] >= 1
    assert isinstance(cpu["usable_cores"], int) and 1 <= cpu["usable_cores"]
    assert cpu["memory_bytes"] is None or cpu["memory_bytes"] > 0
    assert set(cpu["flags"]) == {"avx2", "avx512f", "amx"}
    assert all(isinstance(v, bool) for v in cpu["flags"].values())
    assert record["gpu"] is None or all("name" in g for g in record["gpu"])
    sw = record["software"]
    assert {"python", "torch", "torch_cuda", "triton", "transformers", "vllm"} <= sw.keys()
    assert sw["torch"] is not None and sw["torch"].startswith("2.13.0")
    assert all(v is None or isinstance(v, str) for v in sw.values())
    git = record["git"]
    assert git is None or (len(git["sha"]) == 40 and git["dirty"] in (True, False, None))
    assert record["git_sha"] == (git and git["sha"])  # flat copy, read by experiments.runner
    assert isinstance(record["hostname"], str)
    assert isinstance(record["fingerprint"], str) and len(record["fingerprint"]) == 12
    json.dumps(record)  # the record is plain JSON


def test_fingerprint_is_stable_and_ignores_git_and_hostname(record: dict[str, Any]) -> None:
    again = collect_preflight()
    assert again["fingerprint"] == record["fingerprint"]
    assert compare_fingerprints(record, again) == []
    moved = copy.deepcopy(record)
    moved["hostname"] = "another-box"
    moved["git"] = {"sha": "0" * 40, "dirty": True}
    assert fingerprint(moved) == record["fingerprint"]
    assert compare_fingerprints(record, moved) == []


def test_compare_names_a_changed_torch_version(record: dict[str, Any]) -> None:
    other = copy.deepcopy(record)
    other["software"]["torch"] = "2.14.0"
    assert fingerprint(other) != record["fingerprint"]
    warnings = compare_fingerprints(record, other)
    assert len(warnings) == 1 and warnings[0].startswith("torch differs")
    assert "2.14.0" in warnings[0] and record["software"]["torch"] in warnings[0]


def test_compare_names_a_changed_cpu_model() -> None:
    a = {"cpu": {"model": "Intel Xeon 8480+", "logical_cores": 2, "usable_cores": 2},
         "gpu": None, "software": {"torch": "2.13.0", "triton": "3.7.1"}}
    b = copy.deepcopy(a)
    b["cpu"]["model"] = "AMD EPYC 9654"
    b["cpu"]["logical_cores"] = 4
    warnings = compare_fingerprints(a, b)
    assert [w.split(" ")[0] for w in warnings] == ["cpu_logical_cores", "cpu_model"]
    assert "AMD EPYC 9654" in warnings[1]


def test_compare_gpu_records_by_name_count_and_driver() -> None:
    gpu = parse_nvidia_smi_csv(H200_LINE)
    a = {"cpu": {"model": "x"}, "gpu": gpu, "software": {"torch": "2.13.0"}}
    b = copy.deepcopy(a)
    b["cpu"]["model"] = "y"  # the host CPU does not enter a GPU fingerprint
    b["gpu"][0]["clocks_sm_mhz"] = 1980  # nor does a momentary clock
    assert compare_fingerprints(a, b) == []
    b["gpu"][0]["driver_version"] = "575.51.03"
    assert [w.split(" ")[0] for w in compare_fingerprints(a, b)] == ["gpu_driver"]
    cpu_only = {"cpu": {"model": "x"}, "gpu": None, "software": {"torch": "2.13.0"}}
    assert any(w.startswith("gpu_name") for w in compare_fingerprints(a, cpu_only))


def test_parse_nvidia_smi_csv_h200_line() -> None:
    (gpu,) = parse_nvidia_smi_csv(H200_LINE)
    assert gpu == {
        "name": "NVIDIA H200",
        "uuid": "GPU-5c1d3e7a-0b2f-4c1d-9e8f-0123456789ab",
        "memory_total_mib": 143771,
        "driver_version": "570.133.20",
        "power_limit_w": 700.0,
        "clocks_max_sm_mhz": 1980,
        "clocks_sm_mhz": 345,
    }


def test_parse_nvidia_smi_csv_two_gpus_nounits_and_not_available() -> None:
    text = (
        "NVIDIA A100-SXM4-80GB, GPU-a, 81920, 535.104.05, 400.00, 1410, 210\n"
        "NVIDIA A100-SXM4-80GB, GPU-b, 81920 MiB, 535.104.05, [N/A], [Not Supported], 210 MHz\n"
    )
    a, b = parse_nvidia_smi_csv(text)
    assert a["memory_total_mib"] == b["memory_total_mib"] == 81920
    assert a["power_limit_w"] == 400.0 and a["clocks_max_sm_mhz"] == 1410
    assert b["power_limit_w"] is None and b["clocks_max_sm_mhz"] is None
    assert parse_nvidia_smi_csv("") == []
    with pytest.raises(ValueError, match="expected 7"):
        parse_nvidia_smi_csv("NVIDIA H200, GPU-x, 143771 MiB\n")


def test_collect_gpus_uses_nvidia_smi_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    class Done:
        returncode, stdout = 0, H200_LINE

    seen: list[list[str]] = []
    monkeypatch.setattr(preflight.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(preflight.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or Done())
    gpus = preflight.collect_gpus()
    assert gpus is not None and gpus[0]["name"] == "NVIDIA H200"
    assert seen[0][1] == ("--query-gpu=name,uuid,memory.total,driver_version,power.limit,"
                          "clocks.max.sm,clocks.sm")


def test_parse_cpuinfo_and_meminfo() -> None:
    cpuinfo = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu\n"
    )
    info = parse_cpuinfo(cpuinfo)
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["flags"] == {"avx2": True, "avx512f": True, "amx": True}
    assert info["amx_flags"] == ["amx_bf16", "amx_tile"]
    arm = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert arm["model"] is None and arm["flags"] == {"avx2": False, "avx512f": False, "amx": False}
    assert parse_meminfo_bytes("MemTotal:       24683656 kB\nMemFree: 1 kB\n") == 24683656 * 1024
    assert parse_meminfo_bytes("") is None


def test_git_is_none_outside_a_checkout(tmp_path: Path) -> None:
    assert preflight.collect_git(tmp_path) is None


def test_main_json_table_and_compare(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, record: dict[str, Any]
) -> None:
    out = tmp_path / "pre.json"
    preflight.main(["--json", "--out", str(out)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["fingerprint"] == record["fingerprint"] == json.loads(out.read_text())[
        "fingerprint"
    ]
    old = copy.deepcopy(record)
    old["software"]["transformers"] = "4.0.0"
    (tmp_path / "old.json").write_text(json.dumps(old))
    preflight.main(["--compare", str(tmp_path / "old.json")])
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert any(line.split()[0] == "fingerprint" for line in lines)
    key_width = lines[0].index(lines[0].split()[1])  # values start in one aligned column
    assert all(line[key_width - 2:key_width] == "  " for line in lines)
    assert "WARNING: transformers differs: '4.0.0'" in captured.err

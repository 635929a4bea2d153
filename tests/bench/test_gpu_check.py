"""The device check's CPU side: `--quick` runs every section through the Triton interpreter on
tiny shapes, so the script that a GPU session runs once is exercised end to end here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.bench.gpu.check import hbm_bandwidth, main


def test_hbm_bandwidth_by_device_name() -> None:
    assert hbm_bandwidth("NVIDIA H200") == 4.8e12
    assert hbm_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert hbm_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert hbm_bandwidth("Some Future GPU") is None


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_quick_check_runs_every_section(tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main([str(out), "--quick", "--device", "cpu",
                 "--model-dir", str(tmp_path / "model")]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["errors"] == {}
    s = report["sections"]
    kernels = {r["kernel"] for r in s["kernels"]}
    assert kernels == {"paged_decode", "paged_prefill", "reshape_and_cache", "w8a16_matmul",
                       "w4a16_matmul"}
    assert all(r["ok"] for r in s["kernels"]), s["kernels"]
    assert [(r["batch"], r["context"]) for r in s["attention"]] == [(1, 48), (1, 80), (3, 48),
                                                                    (3, 80)]
    steps = [r for r in s["step"] if "batch" in r]
    assert [(r["batch"], r["cuda_graphs"]) for r in steps] == [(1, False), (3, False)]
    assert all(r["forward_ms"] > 0 and r["decode_forwards"] >= 1 for r in steps)
    systems = [r["system"] for r in s["throughput"]]
    assert systems == ["engine", "hf-generate", "hf-generate_batch"]
    # fp32 greedy on CPU: every request identical across the three systems
    assert all(r["requests_equal_to_engine"] == 3 for r in s["throughput"])
    offload = s["kv_offload"]
    assert [r["system"] for r in offload] == ["recompute", "host tier"]
    assert offload[0]["external_hit_tokens"] == 0 and offload[1]["external_hit_tokens"] > 0
    assert offload[1]["ok"] and offload[1]["requests_equal_to_recompute"] == 6
    assert [r["mode"] for r in s["pd_disagg"]] == ["hold", "layerwise", "push",
                                                   "torch_dist (gloo)"]
    assert s["pd_disagg"][3]["rendezvous_s"] > 0  # the untimed warm-up read formed the group
    for pd in s["pd_disagg"]:
        assert pd["ok"] and pd["requests_equal_to_colocated"] == 3 and pd["failed_recvs"] == 0
        # 3 prompts of 40 tokens: 39 read each, ceil(39 / 16) = 3 blocks apiece
        assert pd["kv_bytes"] > 0 and pd["kv_bytes"] % 9 == 0
    assert s["pd_disagg"][0]["stage_s"] == 0 < s["pd_disagg"][1]["stage_s"]
    assert [pd["pushed_loads"] for pd in s["pd_disagg"]] == [0, 0, 3, 0]
    # the timed batch only: the same bytes over gloo as over ZeroMQ
    assert s["pd_disagg"][3]["kv_bytes"] == s["pd_disagg"][0]["kv_bytes"]
    md = (out / "gpu_check.md").read_text()
    assert "## Kernels vs their PyTorch twins" in md and "FAILED" not in md

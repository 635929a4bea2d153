"""The KV compression frontier (`workbench.experiments.kv_frontier`): the derived columns
exactly on fixed inputs, the table and Markdown builders, the spec's validation, and one tiny
real frontier (bundled random model: full KV and StreamingLLM at 32 tokens) whose memory
columns are exact byte counts."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from workbench.experiments.kv_frontier import (
    COLUMNS,
    FrontierPoint,
    FrontierSpec,
    derive_row,
    frontier_markdown,
    frontier_points,
    frontier_table,
    needle_frame,
    run_frontier,
)
from workbench.experiments.needle import CaseResult, NeedleReport

# tiny llama, fp32: 2 layers x (K + V) x 2 KV heads x head_dim 16 x 4 bytes = 512 per token
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4
TINY_BLOCK = 16 * TINY_BYTES_PER_TOKEN  # 8,192


def _raw(point: str, kept: int, **kw: Any) -> dict[str, Any]:
    return {"point": point, "block_size": 16, "bytes_per_block": TINY_BLOCK,
            "context_tokens": 71, "kept_kv_tokens": kept, "num_blocks": 100, **kw}


def test_derived_columns_exact() -> None:
    full, sllm = derive_row(_raw("none", 71)), derive_row(_raw("streaming_llm/32", 23))
    # full KV: 71 tokens -> 5 blocks -> 40,960 bytes; 100 blocks hold 20 such requests
    assert (full["blocks_per_request"], full["kv_bytes_per_request"]) == (5, 40_960)
    assert full["effective_tokens_per_gb"] == 71 * 10**9 / 40_960 == 1_733_398.4375
    assert full["max_concurrency"] == 20
    # 23 kept tokens -> 2 blocks -> 16,384 bytes: 71 context tokens served, 50 per 100 blocks
    assert (sllm["blocks_per_request"], sllm["kv_bytes_per_request"]) == (2, 16_384)
    assert sllm["effective_tokens_per_gb"] == 71 * 10**9 / 16_384 == 4_333_496.09375
    assert sllm["max_concurrency"] == 50
    assert list(full) == list(COLUMNS) and full["output_throughput"] is None
    # a block boundary: 32 kept tokens are exactly 2 blocks, 33 need 3
    assert derive_row(_raw("x", 32))["blocks_per_request"] == 2
    assert derive_row(_raw("x", 33))["max_concurrency"] == 33
    with pytest.raises(ValueError, match=r"kept_kv_tokens \(72\) must be in \[1, "
                                         r"context_tokens \(71\)\]"):
        derive_row(_raw("x", 72))


def test_table_and_markdown() -> None:
    table = frontier_table([_raw("none", 71, method="none", valid=True, other_cpu_share=0.05,
                                 needle_accuracy=1.0, kv_bytes_per_token=512),
                            _raw("streaming_llm/32", 23, method="streaming_llm", valid=False,
                                 other_cpu_share=0.5, needle_accuracy=0.25,
                                 output_throughput=123.45)])
    assert list(table.columns) == list(COLUMNS)
    assert list(table["max_concurrency"]) == [20, 50]

    def case(n: int, d: float, ok: bool) -> CaseResult:
        return CaseResult(f"{n}-{d}", n, d, "1", "1" if ok else "2", None, ok)

    reports = {"none": NeedleReport("m", {}, [64, 128], [0.0, 1.0], 1, 0,
                                    [case(64, 0.0, True), case(64, 1.0, True),
                                     case(128, 0.0, True), case(128, 1.0, True)]),
               "streaming_llm/32": NeedleReport("m", {}, [64, 128], [0.0, 1.0], 1, 0,
                                                [case(64, 0.0, False), case(64, 1.0, True),
                                                 case(128, 0.0, False), case(128, 1.0, False)])}
    needle = needle_frame(reports)
    assert needle.shape == (8, 6)
    assert list(needle[needle["point"] == "streaming_llm/32"]["accuracy"]) == [0, 1, 0, 0]
    md = frontier_markdown(table, needle, "header")
    lines = md.splitlines()
    assert lines[0] == "header"
    assert lines[4] == ("| none | 512 | 71 / 71 | 5 | 1.73M | 20 | - | - | - | - | ok (5%) "
                        "| 1.00 |")
    assert lines[5] == ("| streaming_llm/32 | - | 23 / 71 | 2 | 4.33M | 50 | - | - | 123.5 | - "
                        "| disturbed (50%) | 0.25 |")
    assert "| none | 1.00 | 1.00 |" in lines and "| streaming_llm/32 | 0.50 | 0.00 |" in lines
    assert "| streaming_llm/32 | 0.00 | 0.50 |" in lines  # by depth 0, 1


def test_points_and_spec_validation() -> None:
    pts = frontier_points(("streaming_llm", "h2o"), (128, 64), ("int4",))
    assert [p.label for p in pts] == ["none", "streaming_llm/64", "streaming_llm/128", "h2o/64",
                                      "h2o/128", "int4"]
    assert pts[1].engine_kwargs() == {"kv_compression_config": {"method": "streaming_llm",
                                                                "budget_tokens": 64}}
    assert pts[-1].engine_kwargs() == {"kv_cache_dtype": "int4"} and pts[0].engine_kwargs() == {}
    with pytest.raises(ValueError, match=r"FrontierPoint.method \('lru'\)"):
        FrontierPoint("lru", 64)
    with pytest.raises(ValueError, match=r"FrontierPoint.budget_tokens \(None\)"):
        FrontierPoint("h2o")
    with pytest.raises(ValueError, match=r"FrontierSpec.engine sets 'kv_cache_dtype'"):
        FrontierSpec(engine={"kv_cache_dtype": "fp8"})
    with pytest.raises(ValueError, match=r"FrontierSpec.kv_dtypes: 'int3'"):
        FrontierSpec(kv_dtypes=("int3",))
    with pytest.raises(ValueError, match=r"FrontierSpec.footprint_requests \(5\) must be <= "
                                         r"num_requests \(4\)"):
        FrontierSpec(num_requests=4, footprint_requests=5)
    assert FrontierSpec(input_len=300, output_len=100, needle_lengths=(128,)).max_model_len() \
        == 400


def test_tiny_real_frontier(tmp_path: Any) -> None:
    """Full KV and StreamingLLM at 32 tokens on the bundled model: 64-token prompts, 8 output
    tokens each, a KV budget of 21 blocks (20 usable: one is the null block)."""
    spec = FrontierSpec(model="bundled", methods=("streaming_llm",), budgets=(32,),
                        kv_dtypes=(), engine={"dtype": "float32", "block_size": 16,
                                              "max_num_seqs": 4, "max_num_batched_tokens": 256},
                        kv_cache_memory_bytes=21 * TINY_BLOCK, input_len=64, output_len=8,
                        num_requests=4, concurrency=4, footprint_requests=2,
                        needle_lengths=(64,), needle_depths=(0.0, 1.0),
                        needle_cases_per_cell=1)
    res = run_frontier(spec)
    t = res.table.set_index("point")
    assert list(t.index) == ["none", "streaming_llm/32"]
    assert list(t["kv_bytes_per_token"]) == [TINY_BYTES_PER_TOKEN] * 2
    assert list(t["bytes_per_block"]) == [TINY_BLOCK] * 2
    assert list(t["num_blocks"]) == [20, 20]
    assert list(t["context_tokens"]) == [71, 71]  # 64 + 8 - 1: the last token is not written
    # StreamingLLM at 32 tokens = 2 blocks: the sink block and the block being written
    # (tokens 64..70); blocks 1..3 (48 tokens) evicted
    assert list(t["kept_kv_tokens"]) == [71, 23] and list(t["evicted_blocks"]) == [0, 3]
    assert list(t["blocks_per_request"]) == [5, 2]
    assert list(t["kv_bytes_per_request"]) == [40_960, 16_384]
    assert list(t["max_concurrency"]) == [4, 10]
    assert list(t["needle_cases"]) == [2, 2]
    assert (t["output_throughput"] > 0).all() and (t["median_tpot_ms"] > 0).all()
    assert t["valid"].all()  # the suite states the CPU share (0)
    assert list(res.needle["point"]) == ["none", "none", "streaming_llm/32", "streaming_llm/32"]
    assert "streaming_llm/32" in res.markdown() and res.machine["cores"] >= 1
    folder = res.write(tmp_path / "out")
    assert sorted(p.name for p in folder.iterdir()) == ["frontier.csv", "frontier.json",
                                                        "frontier.md", "needle.csv"]
    back = pd.read_csv(folder / "frontier.csv")
    assert list(back["kv_bytes_per_request"]) == [40_960, 16_384]


def test_cli_builds_the_spec() -> None:
    """scripts/kv_compression_frontier.py: flags -> FrontierSpec and the output folder."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "kv_compression_frontier.py"
    loader = importlib.util.spec_from_file_location("kv_compression_frontier", path)
    assert loader is not None and loader.loader is not None
    cli = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(cli)
    spec, out = cli.parse(["--model", "bundled", "--methods", "h2o", "--budgets", "32", "64",
                           "--kv-dtypes", "--needle-lengths", "64", "--engine",
                           '{"dtype": "float32", "block_size": 8}', "--out-dir", "x/y"])
    assert spec == FrontierSpec(model="bundled", methods=("h2o",), budgets=(32, 64),
                                kv_dtypes=(), engine={"dtype": "float32", "block_size": 8},
                                needle_lengths=(64,))
    assert [p.label for p in spec.points()] == ["none", "h2o/32", "h2o/64"]
    assert out == Path("x/y")

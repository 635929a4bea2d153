"""Notebook 13 (the KV compression frontier) under papermill with small parameters on the
bundled model: full KV, StreamingLLM at one budget and int4 KV; the table, the Markdown and
the frontier figure come out. Helpers and the pair checks: tests/test_notebooks.py."""

from __future__ import annotations

from pathlib import Path

from tests.test_notebooks import execute, num_images, pngs, text_of


def test_13_kv_compression_frontier(tmp_path: Path) -> None:
    nb, figs = execute("13_kv_compression.ipynb", tmp_path, model="bundled",
                       methods=["streaming_llm"], budgets=[32], kv_dtypes=["int4"],
                       kv_cache_memory_bytes=1048576, input_len=64, output_len=8,
                       num_requests=4, concurrency=2, needle_lengths=[64],
                       needle_depths=[0.0])
    text = text_of(nb)
    for point in ("none", "streaming_llm/32", "int4"):
        assert point in text
    assert "effective_tokens_per_gb" in text and "max_concurrency" in text
    assert "needle accuracy by context length" in text
    assert pngs(figs) == {"frontier.png"} and num_images(nb) == 1

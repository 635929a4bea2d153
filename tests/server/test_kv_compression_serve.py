"""kv_compression_config through the server: the `--kv-compression-config JSON` flag, one
clear error for a bad value, and a served completion under StreamingLLM whose greedy tokens
equal LLM's with the same knob, its evictions on /metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.conftest import start_server, stop_server
from workbench import LLM, SamplingParams
from workbench.config import EngineConfig
from workbench.config.kv_compression import KVCompressionConfig
from workbench.entrypoints.openai.cli_args import parse_args
from workbench.server.app import build_app

KC = {"method": "streaming_llm", "budget_tokens": 16, "sink_tokens": 4}
KW = dict(dtype="float32", max_model_len=128, block_size=4, num_gpu_blocks_override=64,
          max_num_seqs=4, enforce_eager=True)


def test_flag_parses_json_and_refuses_a_bad_value(model_dir: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    _, config = parse_args(["--model", str(model_dir), "--kv-compression-config",
                            '{"method": "streaming_llm", "budget_tokens": 64}'])
    assert config.cache_config.kv_compression_config == KVCompressionConfig(
        method="streaming_llm", budget_tokens=64)
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", str(model_dir), "--kv-compression-config",
                    '{"method": "streaming_llm"}'])
    assert e.value.code == 2
    assert "kv_compression_config needs exactly one of budget_tokens" in capsys.readouterr().err


def test_served_completion_equals_llm_and_reports_evictions(model_dir: Path) -> None:
    prompt = list(range(20, 60))  # 40 tokens: 10 blocks, evicted down to 4 at the decode
    llm = LLM(model_dir, kv_compression_config=KC, **KW)
    want = llm.generate({"prompt_token_ids": prompt}, SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True))[0].outputs[0].token_ids
    llm.close()
    config = EngineConfig.from_kwargs(str(model_dir), kv_compression_config=KC, **KW)
    handle = start_server(build_app(config, served_model_name="tiny"))
    try:
        r = httpx.post(f"{handle.base_url}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True})
        assert r.status_code == 200, r.text
        metrics = handle.metrics()
    finally:
        stop_server(handle)
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == want
    assert metrics["workbench:kv_evicted_blocks_total"] == 7 + 3

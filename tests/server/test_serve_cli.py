"""`workbench serve`: engine knobs as vLLM-spelled flags, one clear error, a real process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from workbench.engine.arg_utils import engine_knobs
from workbench.entrypoints.openai.cli_args import parse_args


def test_every_engine_knob_is_a_flag(model_dir: Path) -> None:
    names = {k.name for k in engine_knobs()}
    assert {"max_num_batched_tokens", "block_size", "enable_prefix_caching", "dtype",
            "max_model_len", "max_num_seqs", "num_gpu_blocks_override", "kv_cache_memory_bytes",
            "enable_chunked_prefill", "long_prefill_token_threshold", "policy",
            "seed"} <= names
    args, config = parse_args([
        "--model", str(model_dir), "--max-num-batched-tokens", "128", "--block-size", "8",
        "--no-enable-prefix-caching", "--dtype", "float32", "--max-model-len", "128",
        "--max-num-seqs", "4", "--num-gpu-blocks-override", "40", "--no-enable-chunked-prefill",
        "--long-prefill-token-threshold", "0", "--policy", "priority", "--seed", "7",
        "--port", "9999", "--api-key", "k",
    ])
    sc, cc, mc = config.scheduler_config, config.cache_config, config.model_config
    assert (sc.max_num_batched_tokens, sc.max_num_seqs, sc.policy) == (128, 4, "priority")
    assert sc.enable_chunked_prefill is False and cc.enable_prefix_caching is False
    assert (cc.block_size, cc.num_gpu_blocks_override) == (8, 40)
    assert (mc.dtype, mc.max_model_len, mc.seed) == ("float32", 128, 7)
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 9999, "k")
    _, default = parse_args([str(model_dir)])
    assert default.cache_config.enable_prefix_caching is True


def test_bad_knob_is_one_clear_error(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", str(model_dir), "--block-size", "3"])
    assert e.value.code == 2
    assert "block_size (3) must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([])


def test_serve_process_answers_the_openai_client(model_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.server.serve", "--model", str(model_dir),
         "--max-model-len", "128", "--num-gpu-blocks-override", "64", "--port", str(port),
         "--served-model-name", "tiny", "--api-key", "k", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # a cold kernel cache builds first
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break  # 503 while the engine warms up (the port is open at once)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        c = client.completions.create(model="tiny", prompt="hello", max_tokens=3,
                                      extra_body={"ignore_eos": True})
        assert c.usage.completion_tokens == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_every_knob_flag_has_its_config_help_and_vllms_policy_spelling(model_dir: Path) -> None:
    from workbench.engine.arg_utils import engine_knobs
    from workbench.entrypoints.openai.cli_args import build_parser

    assert all(k.help for k in engine_knobs()), [k.name for k in engine_knobs() if not k.help]
    text = build_parser().format_help()
    assert "--scheduling-policy POLICY" in text
    assert "most requests running at once; default: 256" in text
    args, config = parse_args(["--model", str(model_dir), "--scheduling-policy", "priority"])
    assert config.scheduler_config.policy == "priority"


def test_scheduling_policy_and_policy_must_agree(model_dir: Path) -> None:
    from workbench.config import EngineConfig

    config = EngineConfig.from_kwargs(str(model_dir), scheduling_policy="priority")
    assert config.scheduler_config.policy == "priority"
    with pytest.raises(ValueError, match=r"scheduling_policy \('priority'\) and policy "
                                         r"\('fcfs'\) name the same knob"):
        EngineConfig.from_kwargs(str(model_dir), scheduling_policy="priority", policy="fcfs")

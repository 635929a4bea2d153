"""`RequestRecord.num_cached_tokens`: the prompt tokens a request did not compute at its first
schedule (vLLM's RequestOutput.num_cached_tokens), from the in-process engine's finish event
and from an OpenAI server's `usage.prompt_tokens_details.cached_tokens`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import RequestRecord, records_frame
from workbench.harness.replay import run, run_sync
from workbench.harness.sse import StreamParser
from workbench.harness.targets import InProcessTarget
from workbench.harness.workloads import BenchRequest, Workload
from workbench.testing import tiny_checkpoint


def test_usage_prompt_tokens_details_fill_it() -> None:
    rec = RequestRecord("a", 0, 0, False)
    p = StreamParser(rec)
    p.feed(json.dumps({"choices": [{"text": "x"}]}), 0.1)
    p.feed(json.dumps({"choices": [], "usage": {
        "prompt_tokens": 40, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 32}}}), 0.2)
    p.finish(0.3)
    assert (rec.prompt_tokens, rec.output_tokens, rec.num_cached_tokens) == (40, 1, 32)
    rec = RequestRecord("b", 0, 0, False)  # a server that does not say: None, NaN in frames
    p = StreamParser(rec)
    p.feed(json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}), 0.1)
    p.finish(0.2)
    assert rec.num_cached_tokens is None
    assert records_frame([rec])["num_cached_tokens"].isna().all()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("cached") / "llama", arch="llama")


def test_the_in_process_engine_reports_the_prefix_hit_at_first_schedule(ckpt: Path) -> None:
    """Two requests, one after the other, with the same 40-token prompt on 16-token blocks:
    the first computes everything; the second finds the first two full blocks cached."""
    prompt = list(range(100, 140))
    wl = Workload("same-prompt", 0, {}, tuple(
        BenchRequest(request_id=f"r{i}", prompt_token_ids=prompt, max_tokens=2)
        for i in range(2)))
    target = InProcessTarget(str(ckpt), {"dtype": "float32", "max_model_len": 128,
                                         "block_size": 16, "enable_prefix_caching": True})
    try:
        res = run(target, wl, ArrivalSpec(mode="closed", concurrency=1), warmup_requests=0,
                  cache_state="cold", max_other_cpu_share=None)
    finally:
        run_sync(target.stop)
    assert [r.num_cached_tokens for r in res.records] == [0, 32]

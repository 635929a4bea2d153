"""AsyncEngine: streams equal LLM.generate, abort frees blocks, a failed step is survivable."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM, SamplingParams
from workbench.config import EngineConfig
from workbench.engine.async_engine import AsyncEngine, AsyncEngineError, StreamEvent
from workbench.engine.llm_engine import LLMEngine
from workbench.testing import tiny_checkpoint

KW: dict[str, Any] = dict(dtype="float32", max_model_len=256, block_size=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ae") / "llama", arch="llama")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(10, 1000) for _ in range(20)]
    out = [[rng.randrange(10, 1000) for _ in range(3 + 7 * i)] for i in range(n // 2)]
    out += [shared + [rng.randrange(10, 1000) for _ in range(1 + i)] for i in range(n - n // 2)]
    return out


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _reference(ckpt: Path, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    outs = LLM(ckpt, **KW).generate(prompts, [_params(m) for m in max_tokens])
    return [o.outputs[0].token_ids for o in outs]


def _engine(ckpt: Path) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(str(ckpt), **KW))


def _check_stream(events: list[StreamEvent], expect: list[int], reason: str = "length") -> None:
    tokens = [t for ev in events for t in ev.token_ids]
    assert tokens == expect
    times = [t for ev in events for t in ev.token_times]
    assert len(times) == len(tokens) and times == sorted(times)
    assert [ev.finished for ev in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].finish_reason == reason and events[-1].times is not None
    t = events[-1].times
    assert t.arrival <= t.first_scheduled <= t.first_token <= t.finished  # type: ignore[operator]


def test_threaded_streams_equal_llm_generate(ckpt: Path) -> None:
    prompts = _prompts(8)
    max_tokens = [5 + i for i in range(8)]
    expect = _reference(ckpt, prompts, max_tokens)
    engine = _engine(ckpt)
    results: dict[int, list[StreamEvent]] = {}

    def client(i: int) -> None:
        req = engine.make_request(prompts[i], _params(max_tokens[i]), request_id=f"r{i}")
        results[i] = list(ae.add_request(req))

    with AsyncEngine(engine) as ae:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert ae.stats()["vllm:request_success"] == 8
        assert len(ae.step_trace()) == ae.stats()["num_steps"]
        # idle: the loop sleeps on its condition variable (no busy-wait); first let torch's
        # OpenMP workers finish their post-op spin
        time.sleep(0.25)
        cpu = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - cpu < 0.1
    for i in range(8):
        _check_stream(results[i], expect[i])


def test_async_streams_and_reset_prefix_cache(ckpt: Path) -> None:
    prompts = _prompts(4, seed=1)
    expect = _reference(ckpt, prompts, [6] * 4)
    engine = _engine(ckpt)

    async def main(ae: AsyncEngine) -> list[list[StreamEvent]]:
        streams = [
            ae.add_request(engine.make_request(p, _params(6), request_id=f"a{i}"))
            for i, p in enumerate(prompts)
        ]

        async def collect(s: Any) -> list[StreamEvent]:
            return [ev async for ev in s]

        return await asyncio.gather(*(collect(s) for s in streams))

    with AsyncEngine(engine) as ae:
        got = asyncio.run(main(ae))
        assert ae.reset_prefix_cache() is True
    for events, exp in zip(got, expect, strict=True):
        _check_stream(events, exp)


def test_abort_frees_blocks(ckpt: Path) -> None:
    engine = _engine(ckpt)
    full_pool = engine.num_blocks - 1
    with AsyncEngine(engine) as ae:
        stream = ae.add_request(engine.make_request(list(range(10, 60)), _params(200), "long"))
        it = iter(stream)
        first = next(it)
        assert first.token_ids and not first.finished
        ae.abort("long")
        rest = list(it)
        assert rest[-1].finished and rest[-1].finish_reason == "abort"
        assert rest[-1].num_output_tokens < 200
        free = ae.submit(lambda e: e.scheduler.kv_cache_manager.num_free_blocks).result(5)
        assert free == full_pool
        assert ae.num_in_flight() == 0


def test_forward_failure_fails_its_requests_and_loop_survives(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(3, seed=2)
    expect = _reference(ckpt, prompts[2:], [7])[0]
    engine = _engine(ckpt)
    real = engine.runner.execute_model
    calls = {"n": 0}

    def flaky(*args: Any) -> dict[str, list[int]]:
        calls["n"] += 1
        if calls["n"] <= 3:  # the batched try and each request alone: nobody to blame
            raise RuntimeError("injected step failure")
        return real(*args)

    monkeypatch.setattr(engine.runner, "execute_model", flaky)
    ae = AsyncEngine(engine)
    # queued before start(): both are in the first (failing) step
    s1 = ae.add_request(engine.make_request(prompts[0], _params(5), "f1"))
    s2 = ae.add_request(engine.make_request(prompts[1], _params(5), "f2"))
    with ae:
        for s in (s1, s2):
            (last,) = list(s)  # one event: finished with "error", no tokens
            assert last.finished and last.finish_reason == "error"
            assert last.token_ids == () and last.num_output_tokens == 0
            assert last.error == "engine step failed: RuntimeError: injected step failure"
        assert ae.errors == []  # nothing escaped the engine's step
        (record,) = engine.errors
        assert record["scope"] == "step" and record["request_ids"] == ["f1", "f2"]
        assert ae.stats()["request_success_by_reason"]["error"] == 2
        events = list(ae.add_request(engine.make_request(prompts[2], _params(7), "ok")))
        _check_stream(events, expect)
        free = ae.submit(lambda e: e.scheduler.kv_cache_manager.num_free_blocks).result(5)
        assert free == engine.num_blocks - 1


def test_scheduler_bug_fails_streams_and_loop_survives(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception escaping step() itself (not a request's, not the forward's) ends every
    in-flight stream with AsyncEngineError; the loop serves the next request."""
    prompts = _prompts(3, seed=2)
    expect = _reference(ckpt, prompts[2:], [7])[0]
    engine = _engine(ckpt)
    real = engine.scheduler.schedule
    calls = {"n": 0}

    def flaky() -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected scheduler bug")
        return real()

    monkeypatch.setattr(engine.scheduler, "schedule", flaky)
    ae = AsyncEngine(engine)
    s1 = ae.add_request(engine.make_request(prompts[0], _params(5), "f1"))
    s2 = ae.add_request(engine.make_request(prompts[1], _params(5), "f2"))
    with ae:
        for s in (s1, s2):
            with pytest.raises(AsyncEngineError, match="injected scheduler bug"):
                list(s)
            assert s.error is not None
        assert len(ae.errors) == 1 and "injected scheduler bug" in ae.errors[0]
        assert ae.stats()["num_step_errors"] == 1
        events = list(ae.add_request(engine.make_request(prompts[2], _params(7), "ok")))
        _check_stream(events, expect)
        free = ae.submit(lambda e: e.scheduler.kv_cache_manager.num_free_blocks).result(5)
        assert free == engine.num_blocks - 1
    with pytest.raises(AsyncEngineError, match="stopped"):
        ae.add_request(engine.make_request(prompts[2], _params(7), "late"))

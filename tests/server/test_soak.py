"""Soak: 64 concurrent streaming clients (the async `openai` client) for 30 s on the tiny
checkpoint: 0 errors, every request accounted for in /metrics, the KV pool empty at the end.

A mix of completions and chat, string and token-id prompts, greedy and sampled, some with
stop strings, and some closed by their client after three chunks (an abort, not an
error). WORKBENCH_SOAK_S overrides the duration.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import openai

from tests.server.conftest import MODEL_NAME, ServerHandle

DURATION_S = float(os.environ.get("WORKBENCH_SOAK_S", "30"))
CLIENTS = 64
WORDS = "prefill decode block cache token budget chunk queue stream batch".split()


async def _one(client: openai.AsyncOpenAI, rng: random.Random, tally: dict[str, int]) -> None:
    max_tokens = rng.randint(4, 40)
    ignore_eos = rng.random() < 0.7
    close_early = False
    common: dict[str, Any] = dict(
        model=MODEL_NAME, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True},
        temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000),
        extra_body={"ignore_eos": ignore_eos},
    )
    if rng.random() < 0.2:
        common["stop"] = [rng.choice(WORDS)[:2]]
    elif ignore_eos and max_tokens >= 10:
        close_early = rng.random() < 0.25  # ends as "length" if not aborted in time
    if rng.random() < 0.5:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
        prompt: Any = text if rng.random() < 0.5 else [rng.randrange(10, 1000)
                                                        for _ in range(rng.randint(1, 100))]
        stream = await client.completions.create(prompt=prompt, **common)
        chat = False
    else:
        content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": content}], **common)
        chat = True
    chunks, finish, usage = 0, None, None
    async for ch in stream:
        chunks += 1
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
        if ch.usage is not None:
            usage = ch.usage
        if close_early and chunks == 3:
            await stream.close()
            tally["closed"] += 1
            return
    assert usage is not None and finish in ("stop", "length"), (finish, usage)
    assert usage.completion_tokens <= max_tokens
    if ignore_eos and "stop" not in common:
        assert usage.completion_tokens == max_tokens and finish == "length"
    tally["chat" if chat else "completions"] += 1
    tally[finish] += 1


async def _worker(base_url: str, seed: int, deadline: float, tally: dict[str, int],
                  errors: list[str]) -> None:
    rng = random.Random(seed)
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0,
                                  timeout=120) as client:
        while time.monotonic() < deadline:
            try:
                await _one(client, rng, tally)
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                errors.append(f"{type(e).__name__}: {e}")


def test_soak_64_streaming_clients(idle_server: ServerHandle) -> None:
    before = idle_server.metrics()
    tally = {"chat": 0, "completions": 0, "closed": 0, "stop": 0, "length": 0}
    errors: list[str] = []

    async def main() -> None:
        deadline = time.monotonic() + DURATION_S
        await asyncio.gather(*(_worker(idle_server.base_url, i, deadline, tally, errors)
                               for i in range(CLIENTS)))

    asyncio.run(main())
    print(f"soak: {DURATION_S:.0f}s, {CLIENTS} clients: {tally}")
    assert errors == [], errors[:5]
    completed = tally["chat"] + tally["completions"]
    assert completed >= CLIENTS and tally["closed"] > 0, tally
    idle_server.wait_idle(timeout_s=30)
    idle_server.engine.submit(lambda e: e.scheduler.kv_cache_manager.check_integrity()).result()
    after = idle_server.metrics()

    def delta(key: str) -> float:
        return after[key] - before[key]

    # a closed stream is an abort, or "length" when the server had already sent it all
    aborted = delta("vllm:request_success_total{finished_reason=abort}")
    assert 0 < aborted <= tally["closed"]
    assert delta("vllm:request_success_total{finished_reason=length}") + aborted == \
        tally["length"] + tally["closed"]
    assert delta("vllm:request_success_total{finished_reason=stop}") == tally["stop"]
    assert delta("vllm:request_success_total{finished_reason=error}") == 0
    assert delta("vllm:e2e_request_latency_seconds_count") == completed + tally["closed"] - aborted
    assert after["vllm:kv_cache_usage_perc"] == 0 and after["vllm:num_requests_running"] == 0

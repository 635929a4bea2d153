"""Micro-benchmark: µs per `allocate_slots` call for a batch of running decoding requests.

    python -m workbench.bench.micro.kv_cache [--num-requests 256] [--block-size 16] [--steps 200]

Prompt lengths are staggered (prompt_len + i % block_size) so that every step about
1/block_size of the requests fill a block (allocation + hashing) and the rest take the fast
path, as in a real decode batch. Also timed: `get_block_ids` for the batch (what the scheduler
calls per scheduled request) and the fast path alone.
"""

from __future__ import annotations

import argparse
import time

from workbench.core.kv_cache.manager import KVCacheManager
from workbench.core.request import Request
from workbench.sampling_params import SamplingParams


def _setup(num_requests: int, block_size: int, prompt_len: int, steps: int):
    max_len = prompt_len + block_size + steps + 1
    num_blocks = 1 + num_requests * (-(-max_len // block_size))
    m = KVCacheManager(num_blocks=num_blocks, block_size=block_size)
    params = SamplingParams(max_tokens=steps + 1)
    reqs = []
    for i in range(num_requests):
        n = prompt_len + i % block_size
        req = Request(f"r{i}", [(i * 7919 + j) % 32000 for j in range(n)], params)
        assert m.allocate_slots(req, n) is not None
        req.num_computed_tokens = n
        req.append_output_token_ids([i % 32000])  # the prefill's sampled token
        reqs.append(req)
    return m, reqs


def run(num_requests: int = 256, block_size: int = 16, prompt_len: int = 512,
        steps: int = 200) -> dict[str, float]:
    m, reqs = _setup(num_requests, block_size, prompt_len, steps)
    alloc = m.allocate_slots
    timed = 0.0
    fast_timed = 0.0
    fast_calls = 0
    ids_timed = 0.0
    for step in range(steps):
        t0 = time.perf_counter()
        for req in reqs:
            if alloc(req, 1) is None:
                raise RuntimeError("benchmark pool too small")
        t1 = time.perf_counter()
        for req in reqs:
            m.get_block_ids(req.request_id)
        t2 = time.perf_counter()
        timed += t1 - t0
        ids_timed += t2 - t1
        # Fast path alone: requests whose next token does not complete a block.
        fast = [r for r in reqs if (r.num_computed_tokens + 1) % block_size != 0]
        t3 = time.perf_counter()
        for req in fast:
            alloc(req, 1)
        fast_timed += time.perf_counter() - t3
        fast_calls += len(fast)
        for req in reqs:
            req.num_computed_tokens += 1
            req.append_output_token_ids([step % 32000])
    m.check_integrity()
    calls = steps * num_requests
    return {
        "us_per_allocate_slots": timed / calls * 1e6,
        "us_per_step_allocate": timed / steps * 1e6,
        "us_per_fast_path_call": fast_timed / max(fast_calls, 1) * 1e6,
        "us_per_get_block_ids": ids_timed / calls * 1e6,
        "us_per_step_get_block_ids": ids_timed / steps * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results = [
        run(args.num_requests, args.block_size, args.prompt_len, args.steps)
        for _ in range(args.repeats)
    ]
    best = {k: min(r[k] for r in results) for k in results[0]}
    print(
        f"{args.num_requests} decoding requests, block_size {args.block_size}, "
        f"{args.steps} steps, best of {args.repeats}:"
    )
    print(f"  allocate_slots (decode, 1 in {args.block_size} fills a block): "
          f"{best['us_per_allocate_slots']:.3f} us/call, "
          f"{best['us_per_step_allocate']:.1f} us/step")
    print(f"  allocate_slots fast path only: {best['us_per_fast_path_call']:.3f} us/call")
    print(f"  get_block_ids: {best['us_per_get_block_ids']:.3f} us/call, "
          f"{best['us_per_step_get_block_ids']:.1f} us/step")


if __name__ == "__main__":
    main()

"""The core runs without torch: a real Scheduler over a few steps in a process where
`import torch` fails (`sys.modules["torch"] = None` before any workbench import), fed
ModelRunnerOutputs built by hand, with a prefix-cache hit on the second request."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json
    import sys

    sys.modules["torch"] = None  # any `import torch` below raises ImportError

    from workbench.config import CacheConfig, SchedulerConfig
    from workbench.core.outputs import ModelRunnerOutput
    from workbench.core.request import Request
    from workbench.core.sched.scheduler import Scheduler
    from workbench.sampling_params import SamplingParams

    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    s = Scheduler(sc, CacheConfig(block_size=4, enable_prefix_caching=True), num_blocks=10)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    s.add_request(Request("a", list(range(10, 20)), params, eos_token_id=2))
    steps = []

    def step(sampled):
        out = s.schedule()
        kv = s.kv_cache_manager
        cached = out.scheduled_cached_reqs
        row = {
            "num_scheduled_tokens": out.num_scheduled_tokens,
            "total": out.total_num_scheduled_tokens,
            "finished_req_ids": sorted(out.finished_req_ids),
            "block_ids": {rid: kv.get_block_ids(rid) for rid in out.num_scheduled_tokens},
            "new": [[d.req_id, d.block_ids, d.num_computed_tokens]
                    for d in out.scheduled_new_reqs],
            "cached": [cached.req_ids, cached.new_block_ids, cached.num_computed_tokens],
        }
        output = ModelRunnerOutput(sampled_token_ids=sampled)
        _, finished = s.update_from_output(out, output)
        row["finished"] = [r.request_id for r in finished]
        kv.check_integrity()
        steps.append(row)

    step({"a": [50]})  # a's whole prompt
    # b shares a's first two full blocks (8 tokens): a prefix-cache hit
    b = Request("b", list(range(10, 18)) + [99, 98], params, eos_token_id=2)
    s.add_request(b)
    step({"a": [51], "b": [60]})  # a decodes its 2nd token (max_tokens): finished
    step({"b": [61]})  # b's last token
    stats = s.make_stats()
    print(json.dumps({
        "steps": steps,
        "b": [b.num_cached_tokens, b.output_token_ids, b.status.name],
        "prefix_cache": [stats.prefix_cache_stats.queries, stats.prefix_cache_stats.hits],
        "torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None,
        "unfinished": s.has_unfinished_requests(),
    }))
""")


def test_scheduler_runs_without_torch() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["steps"] == [
        {"num_scheduled_tokens": {"a": 10}, "total": 10, "finished_req_ids": [],
         "block_ids": {"a": [1, 2, 3]}, "new": [["a", [1, 2, 3], 0]],
         "cached": [[], [], []], "finished": []},
        # b: blocks 1 and 2 hit (8 tokens), 2 tokens computed into a new block 4
        {"num_scheduled_tokens": {"a": 1, "b": 2}, "total": 3, "finished_req_ids": [],
         "block_ids": {"a": [1, 2, 3], "b": [1, 2, 4]}, "new": [["b", [1, 2, 4], 8]],
         "cached": [["a"], [None], [10]], "finished": ["a"]},
        {"num_scheduled_tokens": {"b": 1}, "total": 1, "finished_req_ids": ["a"],
         "block_ids": {"b": [1, 2, 4]}, "new": [], "cached": [["b"], [None], [10]],
         "finished": ["b"]},
    ]
    assert got["b"] == [8, [60, 61], "FINISHED_LENGTH_CAPPED"]
    assert got["prefix_cache"] == [20, 8]  # two 10-token lookups, b's 8 tokens hit
    assert got["torch_loaded"] is False
    assert got["unfinished"] is False

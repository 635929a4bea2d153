"""Prompt logprobs with tensor_parallel_size=2 on CPU (gloo, 2 processes): the LM head's
all-gather is a collective, so every rank must score the same prompt rows (the step input
carries each request's prompt length and k to the workers). Chunked prefill and a vocabulary
padded to the shard size (1001 -> 1002) included; the figures equal TP=1's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.testing import tiny_checkpoint

ENGINE = dict(dtype="float32", max_model_len=128, block_size=4, max_num_seqs=4,
              max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tp_lp") / "llama", arch="llama", seed=0,
                           vocab_size=1001)


def test_tp2_prompt_logprobs_equal_tp1(path: Path) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 1001) for _ in range(n)] for n in (3, 40, 23)]
    runs = {}
    for tp in (1, 2):
        llm = LLM(path, tensor_parallel_size=tp, **ENGINE)
        try:
            for k in (2, -1):
                params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True,
                                        prompt_logprobs=k)
                mixed = [params, SamplingParams(temperature=0.0, max_tokens=4), params]
                runs[tp, k] = llm.generate(prompts, mixed)
        finally:
            llm.close()
    for k in (2, -1):
        for one, two, p in zip(runs[1, k], runs[2, k], prompts, strict=True):
            assert one.outputs[0].token_ids == two.outputs[0].token_ids
            a, b = one.prompt_logprobs_tensors, two.prompt_logprobs_tensors
            if one is runs[1, k][1]:  # the request without prompt logprobs
                assert a is None and b is None
                continue
            assert a is not None and b is not None and len(a) == len(b) == len(p) - 1
            assert b.logprob_token_ids[:, 0].tolist() == p[1:]
            torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-5, rtol=0)
            assert b.selected_token_ranks.tolist() == a.selected_token_ranks.tolist()
            if k == -1:
                assert b.full_logprobs is not None and b.full_logprobs.shape == (len(p) - 1, 1001)
                torch.testing.assert_close(b.full_logprobs, a.full_logprobs, atol=1e-5, rtol=0)

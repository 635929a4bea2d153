"""Tensor parallelism without processes: config validation, rank r's weight shards (layers
built under `tensor_parallel_scope`), the step delta rank 0 sends its workers, the Ray
worker's check of its connection to rank 0."""

from __future__ import annotations

import json
import pickle
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from workbench.config import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_parallel_scope,
)
from workbench.executor.tp_model_runner import MultiprocModelRunner
from workbench.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from workbench.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from workbench.sampling_params import SamplingParams
from workbench.worker.ray_worker import rank0_gone
from workbench.worker.request_state import (
    CachedRequestState,
    append_sampled,
    update_request_states,
)


def _config_only(path: Path, heads: int, kv_heads: int, intermediate: int = 128) -> Path:
    """A model folder with just config.json (enough for EngineConfig; no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": heads * 16,
        "intermediate_size": intermediate, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": 256,
    }))
    return path


# ------------------------------------------------------------------ config validation
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tensor_parallel_size": 0}, r"tensor_parallel_size \(0\) must be an integer >= 1"),
    ({"tensor_parallel_size": True}, r"tensor_parallel_size \(True\) must be an integer"),
    ({"distributed_executor_backend": "rey"},
     r"distributed_executor_backend \('rey'\) must be one of 'mp', 'ray', 'external_launcher'$"),
])
def test_parallel_config_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kwargs)


def test_the_ray_backend_without_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.config.parallel.ray_installed", lambda: False)
    with pytest.raises(ValueError) as e:
        ParallelConfig(tensor_parallel_size=2, distributed_executor_backend="ray")
    assert str(e.value) == (
        "distributed_executor_backend ('ray') needs Ray, which is not installed: "
        "pip install -e '.[cluster]' (or use 'mp': the ranks as processes on this machine)")


def test_the_ray_watchdog_sees_rank_0_go_without_reading_its_messages() -> None:
    a, b = socket.socketpair()
    try:
        assert rank0_gone(b) is False  # open, nothing sent
        a.sendall(b"step")
        assert rank0_gone(b) is False  # a message waits: left for the worker loop
        assert b.recv(4) == b"step"
        a.close()
        assert rank0_gone(b) is True  # end of stream: rank 0's process is gone
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(("heads", "kv", "tp"), [(4, 2, 3), (6, 3, 2), (4, 4, 8), (8, 2, 6)])
def test_indivisible_heads_are_one_clear_error(
    tmp_path: Path, heads: int, kv: int, tp: int
) -> None:
    path = _config_only(tmp_path / "m", heads, kv)
    msg = (rf"tensor_parallel_size \({tp}\) does not fit the model's heads: "
           rf"num_attention_heads \({heads}\).*num_key_value_heads \({kv}\)")
    with pytest.raises(ValueError, match=msg):
        EngineConfig.from_kwargs(str(path), tensor_parallel_size=tp, device="cpu")


@pytest.mark.parametrize(("heads", "kv", "tp"), [(4, 2, 2), (4, 1, 2), (4, 1, 4), (8, 2, 4)])
def test_divisible_heads_pass(tmp_path: Path, heads: int, kv: int, tp: int) -> None:
    path = _config_only(tmp_path / "m", heads, kv)
    cfg = EngineConfig.from_kwargs(str(path), tensor_parallel_size=tp, device="cpu")
    assert cfg.parallel_config.tensor_parallel_size == tp


def test_intermediate_size_must_divide(tmp_path: Path) -> None:
    path = _config_only(tmp_path / "m", 4, 2, intermediate=130)
    with pytest.raises(ValueError, match=r"must divide the model's intermediate_size \(130\)"):
        EngineConfig.from_kwargs(str(path), tensor_parallel_size=4, device="cpu")


def test_speculative_with_tp_is_not_supported_yet(tmp_path: Path) -> None:
    path = _config_only(tmp_path / "m", 4, 2)
    with pytest.raises(ValueError, match=r"speculative_config with tensor_parallel_size \(2\) "
                                         r"is not supported yet"):
        EngineConfig.from_kwargs(str(path), tensor_parallel_size=2, device="cpu",
                                 speculative_config={"method": "ngram"})


def test_serve_flags_include_the_parallel_knobs() -> None:
    from workbench.entrypoints.openai.cli_args import build_parser

    args = build_parser().parse_args(
        ["m", "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]
    )
    assert (args.tensor_parallel_size, args.distributed_executor_backend) == (2, "mp")


# -------------------------------------------------------------------- weight shards
def test_scope_is_what_layers_see() -> None:
    assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (0, 1)
    with tensor_parallel_scope(1, 2):
        assert (get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()) == (1, 2)
    assert get_tensor_model_parallel_world_size() == 1


def _load_qkv(rank: int, tp: int, heads: int, kv: int, d: int = 2) -> QKVParallelLinear:
    with tensor_parallel_scope(rank, tp):
        layer = QKVParallelLinear(3, d, heads, kv, bias=True)
    # row h*d + i of q/k/v holds value (head h): 100 * h + {0, 10, 20}[proj] + i
    for sid, base in (("q", 0), ("k", 10), ("v", 20)):
        n = heads if sid == "q" else kv
        w = (torch.arange(n).repeat_interleave(d) * 100 + base + torch.arange(d).repeat(n))
        layer.weight_loader(layer.weight, w.float()[:, None].expand(-1, 3), sid)
        layer.weight_loader(layer.bias, w.float(), sid)
    return layer


def test_qkv_shards_heads_and_replicates_the_kv_head() -> None:
    # 4 query heads, 1 KV head, tp 2: rank r has query heads 2r, 2r+1 and the KV head 0
    for rank in (0, 1):
        layer = _load_qkv(rank, 2, heads=4, kv=1)
        assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (2, 1, 2)
        q = [2 * rank * 100, 2 * rank * 100 + 1, (2 * rank + 1) * 100, (2 * rank + 1) * 100 + 1]
        assert layer.bias.tolist() == q + [10, 11, 20, 21]
        assert torch.equal(layer.weight[:, 0], layer.bias)


def test_qkv_shards_kv_heads_when_tp_divides_them() -> None:
    # 4 query heads, 2 KV heads, tp 2: rank 1 has query heads 2, 3 and KV head 1
    layer = _load_qkv(1, 2, heads=4, kv=2)
    assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (2, 1, 1)
    assert layer.bias.tolist() == [200, 201, 300, 301, 110, 111, 120, 121]
    # tp 4 > 2 KV heads: rank 3 holds KV head 3 // 2 = 1
    layer = _load_qkv(3, 4, heads=4, kv=2)
    assert layer.bias.tolist() == [300, 301, 110, 111, 120, 121]


def test_merged_and_row_parallel_shards() -> None:
    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)  # [out 8, in 6]
    with tensor_parallel_scope(1, 2):
        gate_up = MergedColumnParallelLinear(6, [8, 8])
        row = RowParallelLinear(6, 8, bias=True)
    gate_up.weight_loader(gate_up.weight, full, 0)
    gate_up.weight_loader(gate_up.weight, full + 1000, 1)
    assert torch.equal(gate_up.weight, torch.cat([full[4:], full[4:] + 1000]))
    row.weight_loader(row.weight, full)
    row.weight_loader(row.bias, torch.arange(8.0))
    assert torch.equal(row.weight, full[:, 3:])
    assert row.bias.tolist() == list(range(8))  # replicated; only rank 0 adds it


def test_vocab_is_padded_to_a_multiple_of_tp() -> None:
    table = torch.arange(5 * 2, dtype=torch.float32).view(5, 2) + 1  # vocab 5, hidden 2
    shards = []
    for rank in (0, 1):
        with tensor_parallel_scope(rank, 2):
            emb = VocabParallelEmbedding(5, 2)
            head = ParallelLMHead(5, 2)
        emb.weight_loader(emb.weight, table)
        assert (emb.vocab_start_index, emb.vocab_end_index) == ((0, 3) if rank == 0 else (3, 5))
        assert head.num_embeddings_per_partition == 3
        shards.append(emb.weight)
    assert torch.equal(shards[0], table[:3])
    assert torch.equal(shards[1], torch.cat([table[3:], torch.zeros(1, 2)]))  # padding row


# ----------------------------------------------------------------------- step message
def _req(rid: str, ids: list[int]) -> Request:
    return Request(rid, ids, SamplingParams(temperature=0.0, max_tokens=4))


def test_the_step_message_brings_a_rank_that_does_not_sample_along() -> None:
    """The same SchedulerOutput, pickled, to a TP rank: requests whole once, then only the
    tokens rank 0 sampled (new_token_ids, from rank 0's own states); finished ones dropped;
    a new Request reusing an id starts afresh."""
    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32)
    s = Scheduler(sc, CacheConfig(block_size=4), num_blocks=10)
    rank0: dict[str, CachedRequestState] = {}
    rank1: dict[str, CachedRequestState] = {}
    sender: Any = SimpleNamespace(requests=rank0, num_sent_tokens={})

    def send() -> tuple[SchedulerOutput, list[CachedRequestState]]:
        out = s.schedule()
        MultiprocModelRunner.fill_new_token_ids(sender, out)  # what rank 0 does, then sends
        received = pickle.loads(pickle.dumps(out))
        update_request_states(rank0, out, apply_new_token_ids=False)
        return out, update_request_states(rank1, received, apply_new_token_ids=True)[0]

    def sample(out: SchedulerOutput, tokens: dict[str, list[int]]) -> None:
        append_sampled(rank0, tokens.items())  # rank 0 samples; rank 1 does not
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=tokens))

    s.add_request(_req("a", [5, 6, 7]))
    s.add_request(_req("b", [8, 9]))
    out, got = send()
    assert [(st.req_id, st.all_token_ids, st.block_ids) for st in got] == [
        ("a", [5, 6, 7], [1]), ("b", [8, 9], [2])]
    sample(out, {"a": [11], "b": [12]})
    s.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    out, got = send()
    assert out.scheduled_cached_reqs.new_token_ids == [[11]] and out.finished_req_ids == {"b"}
    assert [(st.req_id, st.all_token_ids, st.num_computed_tokens) for st in got] == [
        ("a", [5, 6, 7, 11], 3)]
    assert sorted(rank1) == ["a"]
    sample(out, {"a": [13]})
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    s.add_request(_req("a", [1, 2]))  # a new Request reusing id "a": sent whole
    out, got = send()
    assert [d.req_id for d in out.scheduled_new_reqs] == ["a"]
    assert [(st.all_token_ids, st.num_computed_tokens) for st in got] == [([1, 2], 0)]
    assert rank1["a"].all_token_ids == rank0["a"].all_token_ids == [1, 2]

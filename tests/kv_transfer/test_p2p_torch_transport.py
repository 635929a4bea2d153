"""The P2pConnector with `transport: "torch_dist"` on CPU: control over ZeroMQ, the KV over a
two-rank gloo group per pair (NCCL is the same code on CUDA caches; it needs a GPU per
instance and has not run yet). Same tiny Llama and fixtures as test_p2p: greedy tokens
identical to a colocated instance, exact bytes (the connector's counters and the bytes
that crossed the group), the producer gone before or during a read (recompute, then a
reconnect), a plain zmq consumer served as bytes, push falling back to ZeroMQ, config
validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.kv_transfer import test_p2p as base
from tests.kv_transfer.test_p2p import PREFILL, decode_params, disaggregated, engine
from tests.kv_transfer.test_p2p_push import inbox_done, push_prefill
from workbench import LLM
from workbench.distributed.kv_transfer.p2p_torch_group import backend_for
from workbench.distributed.kv_transfer.p2p_torch_transport import TorchDistTransport

ckpt, prompts, reference = base.ckpt, base.prompts, base.reference  # the same fixtures

TD = {"transport": "torch_dist"}
READ_BLOCKS = 9 + 16 + 1 + 0  # ceil((P - 1) / 4) for P = 37, 64, 5, 1


def transport(llm: LLM) -> TorchDistTransport:
    t = llm.engine.runner.kv_connector.transport
    assert isinstance(t, TorchDistTransport)
    return t


def test_greedy_tokens_and_bytes_over_gloo(ckpt: Path, prompts: list[list[int]],
                                           reference: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer", **TD), engine(ckpt, "kv_consumer", **TD)
    assert disaggregated(prod, cons, prompts) == reference
    prod.engine.poll_kv_transfers()
    assert prod.engine.scheduler.sending == {}  # every hold read and freed
    assert prod.engine.scheduler.kv_cache_manager.usage == 0.0
    bpb = cons.engine.bytes_per_block
    c, p = cons.stats(), prod.stats()
    assert c["workbench:kv_transfer_recv_tokens"] == 36 + 63 + 4 + 0
    assert c["workbench:kv_transfer_recv_bytes"] == READ_BLOCKS * bpb
    assert p["workbench:kv_transfer_send_bytes"] == READ_BLOCKS * bpb
    assert p["workbench:kv_transfer_sends"] == 4  # three reads and one release
    assert c["workbench:kv_transfer_failed_recvs"] == 0
    # the payload crossed the gloo group, not the ZeroMQ socket: one group, both ends
    ct, pt = transport(cons), transport(prod)
    assert ct.backend == pt.backend == "gloo"
    assert ct.received_bytes == pt.sent_bytes == READ_BLOCKS * bpb
    (peer,) = ct._peers.values()
    assert peer.group is not None and peer.group.epoch == 1
    assert list(pt._groups) == [ct.uid]


def test_layerwise_send_buffers_over_gloo(ckpt: Path, prompts: list[list[int]],
                                          reference: list[list[int]]) -> None:
    """Reads served from host send buffers (not device blocks) take the same path."""
    prod = base.layerwise_engine(ckpt, 128, **TD)
    cons = engine(ckpt, "kv_consumer", **TD)
    assert disaggregated(prod, cons, prompts) == reference
    prod.engine.poll_kv_transfers()
    bpb = prod.engine.bytes_per_block
    assert prod.stats()["workbench:kv_transfer_send_bytes"] == READ_BLOCKS * bpb
    assert transport(cons).received_bytes == READ_BLOCKS * bpb
    assert prod.engine.scheduler.connector.buffer_used == 0


def _die_mid_read(prod: LLM) -> None:
    """The producer answers the read's header, then its group goes before the payload."""
    t = transport(prod)

    def gone(group: Any, frames: list[torch.Tensor], tag: int, ready: Any) -> None:
        t._drop(group, "the producer died (test)")

    t._send = gone  # type: ignore[method-assign]


@pytest.mark.parametrize("when", ["before", "mid-read"])
def test_producer_gone_recomputes_then_reconnects(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], when: str) -> None:
    prod = engine(ckpt, "kv_producer", **TD)
    cons = engine(ckpt, "kv_consumer", load_timeout_s=60.0, **TD)
    if when == "mid-read":
        assert disaggregated(prod, cons, prompts[2:3]) == reference[2:3]  # a group exists
        _die_mid_read(prod)
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    if when == "before":
        prod.engine.shutdown()  # the side channel closes: the rendezvous is refused
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    c = cons.stats()
    assert c["workbench:kv_transfer_failed_recvs"] == 1
    bpb = cons.engine.bytes_per_block
    assert c["workbench:kv_transfer_recv_bytes"] == (1 if when == "mid-read" else 0) * bpb
    message = cons.engine.errors[-1]["message"]
    if when == "before":
        assert "rendezvous" in message and "refused" in message
        return
    assert "torch_dist receive" in message  # the closed connection, not the 60 s timeout
    (peer,) = transport(cons)._peers.values()
    assert peer.group is None  # dropped; the next read makes a new group
    del transport(prod)._send  # the producer is healthy again
    assert disaggregated(prod, cons, prompts[1:2]) == reference[1:2]
    assert peer.group is not None and peer.group.epoch == 2
    assert cons.stats()["workbench:kv_transfer_recv_bytes"] == (1 + 16) * bpb


def test_zmq_consumer_reads_a_torch_dist_producer_as_bytes(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer", **TD), engine(ckpt, "kv_consumer")
    assert disaggregated(prod, cons, prompts[:2]) == reference[:2]
    bpb = cons.engine.bytes_per_block
    assert cons.stats()["workbench:kv_transfer_recv_bytes"] == (9 + 16) * bpb
    assert transport(prod).sent_bytes == 0 and transport(prod)._groups == {}


def test_torch_dist_consumer_of_a_zmq_producer_recomputes(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer", **TD)
    assert disaggregated(prod, cons, prompts[:1]) == reference[:1]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    message = cons.engine.errors[-1]["message"]
    assert "rendezvous" in message and "(is its transport torch_dist?)" in message


def test_push_travels_over_zeromq(ckpt: Path, prompts: list[list[int]],
                                  reference: list[list[int]]) -> None:
    """torch_dist does not carry pushes: its pusher is ZeroMQ's; the read after a push only
    releases the producer's buffer (over the group's control path, no payload)."""
    cons = engine(ckpt, "kv_consumer", **TD)
    info = cons.engine.kv_transfer_info()
    assert info is not None
    prod = base.layerwise_engine(ckpt, 128, **TD)
    outs = prod.generate(prompts, push_prefill(info["side_channel_host"],
                                               info["side_channel_port"]))
    assert inbox_done(cons, 4) == 4
    got = cons.generate(prompts, [decode_params(o.kv_transfer_params) for o in outs])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    c = cons.stats()
    assert c["workbench:kv_transfer_pushed_loads"] == 3  # the 1-token prompt reads nothing
    assert c["workbench:kv_transfer_recv_bytes"] == READ_BLOCKS * cons.engine.bytes_per_block
    assert transport(cons).received_bytes == 0


def test_backend_follows_the_kv_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 1)
    assert [backend_for(cpu), backend_for(cuda)] == ["gloo", "nccl"]
    assert [backend_for(cpu, "gloo"), backend_for(cuda, "gloo")] == ["gloo", "gloo"]
    assert backend_for(cuda, "nccl") == "nccl"
    with pytest.raises(ValueError, match=r"torch_dist_backend \('nccl'\) needs a CUDA KV "
                       r"cache; this one is on cpu: use 'gloo' or 'auto'"):
        backend_for(cpu, "nccl")
    with pytest.raises(ValueError, match=r"transport \('torch_dist'\) needs a KV cache on "
                       r"cpu \(gloo\) or cuda \(nccl\), or torch_dist_backend 'gloo'; this "
                       r"one is on meta"):
        backend_for(torch.device("meta"))


def test_gloo_stages_a_device_cache_through_the_host() -> None:
    """torch_dist_backend gloo on a non-CPU cache (two instances sharing one GPU): the
    payload is sent from and received into host tensors ("meta" stands in for the GPU)."""
    t = TorchDistTransport(backend="gloo")
    t.register_kv_caches([torch.zeros(2, 3, 4, 1, 2, device="meta")])
    assert (t.device.type, t.backend, t.wire) == ("meta", "gloo", torch.device("cpu"))
    t.close()


@pytest.mark.parametrize(("extra", "message"), [
    ({"transport": "torch_dist"}, None),
    ({"transport": "torch_dist", "torch_dist_backend": "gloo"}, None),
    ({"transport": "nccl"},
     "kv_connector_extra_config transport ('nccl') must be one of zmq, torch_dist"),
    ({"transport": None}, "transport (None) must be one of zmq, torch_dist"),
    ({"transport": "torch_dist", "torch_dist_backend": "mpi"},
     "torch_dist_backend ('mpi') must be one of auto, gloo, nccl"),
    ({"torch_dist_backend": "nccl"},
     "torch_dist_backend ('nccl') is only for transport 'torch_dist' (transport is 'zmq')"),
])
def test_transport_config(extra: dict[str, Any], message: str | None) -> None:
    from workbench.config.kv_transfer import KVTransferConfig

    cfg = {"kv_connector": "P2pConnector", "kv_role": "kv_consumer",
           "kv_connector_extra_config": extra}
    if message is None:
        p2p = KVTransferConfig.from_dict(cfg).p2p
        assert p2p is not None and p2p.transport == "torch_dist"
        assert p2p.torch_dist_backend == extra.get("torch_dist_backend", "auto")
        return
    with pytest.raises(ValueError) as e:
        KVTransferConfig.from_dict(cfg)
    assert message in str(e.value)

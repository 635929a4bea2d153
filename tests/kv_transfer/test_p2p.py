"""The P2pConnector on a tiny Llama (fp32, CPU): a prefill instance (kv_producer) and a decode
instance (kv_consumer) in one process, the KV read over ZeroMQ on 127.0.0.1. Greedy tokens
identical to a colocated instance: plain prompts at and off block boundaries, prefix-cache
hits on the prefill side and on the decode side, preemption on the decode side; failures
(the producer gone, restarted, or its hold expired) recompute; exact counters."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM
from workbench.sampling_params import SamplingParams
from workbench.testing import tiny_checkpoint

BLOCK = 4
LENGTHS = (37, 64, 5, 1)  # off a block boundary, on one, one block and a bit, one token
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
PREFILL = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True,
                         extra_args={"kv_transfer_params": {"do_remote_decode": True}})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("p2p") / "llama", arch="llama", seed=0)


@pytest.fixture(scope="module")
def prompts(ckpt: Path) -> list[list[int]]:
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    return [[rng.randrange(10, vocab) for _ in range(n)] for n in LENGTHS]


def engine(ckpt: Path, role: str | None = None, blocks: int = 64, seqs: int = 4,
           **extra: Any) -> LLM:
    kt = None if role is None else {"kv_connector": "P2pConnector", "kv_role": role,
                                    "kv_connector_extra_config": extra}
    return LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=blocks, max_num_seqs=seqs,
               max_num_batched_tokens=64, max_model_len=128, kv_transfer_config=kt)


@pytest.fixture(scope="module")
def reference(ckpt: Path, prompts: list[list[int]]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in engine(ckpt).generate(prompts, GREEDY)]


def decode_params(kvp: dict[str, Any] | None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                          extra_args={"kv_transfer_params": kvp} if kvp else None)


def disaggregated(prod: LLM, cons: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's prefill leg on `prod`, then all decode legs on `cons` at once."""
    handshakes = [o.kv_transfer_params for o in prod.generate(prompts, PREFILL)]
    outs = cons.generate(prompts, [decode_params(k) for k in handshakes])
    return [list(o.outputs[0].token_ids) for o in outs]


def test_greedy_tokens_equal_colocated_and_counters(ckpt: Path, prompts: list[list[int]],
                                                    reference: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    first = prod.generate(prompts[:1], PREFILL)[0]
    kvp = first.kv_transfer_params
    assert kvp is not None
    # vLLM's NixlConnector handshake; the blocks hold the 37 prompt tokens: ceil(37 / 4)
    assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
    assert kvp["remote_block_ids"] == list(range(1, 11))
    assert kvp["remote_request_id"] == "0" and kvp["remote_host"] == "127.0.0.1"
    assert kvp["remote_engine_id"] == prod.engine.runner.kv_connector.engine_id
    assert kvp["remote_port"] == prod.engine.runner.kv_connector.port > 0
    assert kvp["tp_size"] == 1
    assert prod.engine.scheduler.sending.keys() == {"0"}  # held for the decode instance
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert disaggregated(prod, cons, prompts[1:]) == reference[1:]
    prod.engine.poll_kv_transfers()
    assert prod.engine.scheduler.sending == {}  # every hold read and freed
    # the decode side read all prompt tokens but the last: 36 + 63 + 4 + 0
    c, p = cons.stats(), prod.stats()
    assert c["workbench:kv_transfer_recv_tokens"] == 36 + 63 + 4 + 0
    assert c["workbench:kv_transfer_recv_queries"] == 4
    bpb = cons.engine.bytes_per_block
    blocks_read = 9 + 16 + 1 + 0  # ceil(36 / 4), ceil(63 / 4), ceil(4 / 4), nothing
    assert c["workbench:kv_transfer_recv_bytes"] == blocks_read * bpb
    assert p["workbench:kv_transfer_send_bytes"] == blocks_read * bpb
    assert p["workbench:kv_transfer_held_blocks"] == 10 + 16 + 2 + 1  # ceil(P / 4)
    assert p["workbench:kv_transfer_sends"] == 4  # three reads and one release
    assert p["workbench:kv_transfer_send_wait_time"] > 0
    assert c["workbench:kv_transfer_failed_recvs"] == 0
    assert p["workbench:kv_transfer_expired_sends"] == 0
    assert out.metrics is not None and out.metrics.num_cached_tokens == 36
    # every block the prefill instance held is back in its pool
    assert prod.engine.scheduler.kv_cache_manager.usage == 0.0


def test_request_timeline_carries_the_transfer(ckpt: Path, prompts: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    kvp = prod.generate(prompts[1:2], PREFILL)[0].kv_transfer_params
    req = cons.engine.make_request(prompts[1], decode_params(kvp))
    cons.engine.add_request(req)
    while not req.is_finished():
        cons.engine.step()
    t = req.times
    assert t.kv_transfer_bytes == 16 * cons.engine.bytes_per_block
    assert t.kv_transfer_s > 0
    assert t.kv_load_start is not None and t.kv_load_done is not None
    assert t.first_scheduled == t.kv_load_start <= t.kv_load_done <= t.first_token  # type: ignore[operator]


def test_prefix_hits_on_both_sides(ckpt: Path, prompts: list[list[int]],
                                   reference: list[list[int]]) -> None:
    """The prefill instance serves a repeated prompt from its prefix cache (the held blocks
    are shared); the decode instance that already holds a prefix reads only the rest, or
    nothing (then it only releases the hold)."""
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    long = prompts[1]  # 64 tokens
    assert disaggregated(prod, cons, [long]) == [reference[1]]
    again = prod.generate([long], PREFILL)[0]
    assert again.num_cached_tokens == 60  # 15 full blocks (the last token is recomputed)
    out = cons.generate([long], decode_params(again.kv_transfer_params))[0]
    assert list(out.outputs[0].token_ids) == reference[1]
    c = cons.stats()
    # second time the decode instance had 60 tokens cached: it read 63 - 60 = 3 more
    assert c["workbench:kv_transfer_recv_tokens"] == 63 + 3
    prod.engine.poll_kv_transfers()
    assert prod.engine.scheduler.sending == {}
    assert prod.engine.scheduler.kv_cache_manager.usage == 0.0


def test_preemption_on_the_decode_side_recomputes_exactly(ckpt: Path) -> None:
    """Two 64-token prompts decoding 40 tokens each need 26 blocks apiece at the end; the
    decode pool has 33 usable. Both loads are allocated in the first step (16 + 16 blocks),
    so they cannot both finish without a preemption, whatever the loads' timing: the victim
    recomputes (the hold was read once) and both still produce the colocated tokens."""
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    two = [[rng.randrange(10, vocab) for _ in range(64)] for _ in range(2)]
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [list(o.outputs[0].token_ids) for o in engine(ckpt).generate(two, long)]
    prod = engine(ckpt, "kv_producer")
    cons = engine(ckpt, "kv_consumer", blocks=34)
    handshakes = [o.kv_transfer_params for o in prod.generate(two, PREFILL)]
    outs = cons.generate(two, [SamplingParams(
        temperature=0, max_tokens=40, ignore_eos=True,
        extra_args={"kv_transfer_params": k}) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in outs] == want
    assert cons.stats()["vllm:num_preemptions"] >= 1
    assert cons.stats()["workbench:kv_transfer_recv_tokens"] == 2 * 63
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 0


def test_producer_gone_the_decode_side_recomputes(ckpt: Path, prompts: list[list[int]],
                                                  reference: list[list[int]]) -> None:
    prod = engine(ckpt, "kv_producer")
    cons = engine(ckpt, "kv_consumer", load_timeout_s=60.0)
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    prod.engine.shutdown()  # the side channel closes: connections are refused
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert cons.stats()["workbench:kv_transfer_recv_bytes"] == 0
    errors = cons.engine.errors
    assert errors[-1]["scope"] == "kv_transfer" and "refused" in errors[-1]["message"]


def test_restarted_producer_refuses_stale_handshake(ckpt: Path, prompts: list[list[int]],
                                                    reference: list[list[int]]) -> None:
    prod = engine(ckpt, "kv_producer")
    cons = engine(ckpt, "kv_consumer")
    kvp = dict(prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params or {})
    kvp["remote_engine_id"] = "an-earlier-life"
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert "not this instance's" in cons.engine.errors[-1]["message"]


def test_unread_hold_expires_and_a_late_read_recomputes(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod = engine(ckpt, "kv_producer", abort_timeout_s=1e-6)
    cons = engine(ckpt, "kv_consumer", load_timeout_s=60.0)
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    prod.engine.poll_kv_transfers()  # past the deadline: freed
    assert prod.stats()["workbench:kv_transfer_expired_sends"] == 1
    assert prod.engine.scheduler.sending == {}
    out = cons.generate(prompts[:1], decode_params(kvp))[0]  # refused at once, not parked
    assert list(out.outputs[0].token_ids) == reference[0]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert "freed after abort_timeout_s" in cons.engine.errors[-1]["message"]


def test_a_second_read_of_a_hold_is_refused(ckpt: Path, prompts: list[list[int]],
                                            reference: list[list[int]]) -> None:
    prod = engine(ckpt, "kv_producer")
    first, second = engine(ckpt, "kv_consumer"), engine(ckpt, "kv_consumer")
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    for cons in (first, second):
        out = cons.generate(prompts[:1], decode_params(kvp))[0]
        assert list(out.outputs[0].token_ids) == reference[0]
    assert first.stats()["workbench:kv_transfer_failed_recvs"] == 0
    assert second.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert "already read" in second.engine.errors[-1]["message"]


def test_only_a_length_capped_prefill_holds_its_blocks(ckpt: Path,
                                                       prompts: list[list[int]]) -> None:
    prod = engine(ckpt, "kv_producer")
    plain = prod.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=1))[0]
    assert plain.kv_transfer_params is None
    assert prod.engine.scheduler.sending == {}


@pytest.mark.parametrize(("role", "kvp", "message"), [
    ("kv_consumer", {"do_remote_decode": True}, "needs a prefill instance"),
    ("kv_producer", {"do_remote_prefill": True, "remote_engine_id": "e",
                     "remote_request_id": "r", "remote_block_ids": [1], "remote_host": "h",
                     "remote_port": 1}, "needs a decode instance"),
    (None, {"do_remote_decode": True}, "this one has none"),
])
def test_a_handshake_the_instance_cannot_honour_is_refused(
        ckpt: Path, role: str | None, kvp: dict[str, Any], message: str) -> None:
    llm = engine(ckpt, role)
    with pytest.raises(ValueError, match=message):
        llm.generate([[11, 12, 13]], SamplingParams(max_tokens=1,
                                                    extra_args={"kv_transfer_params": kvp}))


@pytest.mark.parametrize(("kvp", "message"), [
    ({"do_remote_prefill": True}, "needs remote_engine_id, remote_request_id, "
     "remote_block_ids, remote_host, remote_port"),
    ({"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
      "remote_block_ids": [], "remote_host": "h", "remote_port": 1}, "remote_block_ids"),
    ({"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
      "remote_block_ids": [1], "remote_host": "h", "remote_port": 70000}, "remote_port"),
    ({"do_remote_decode": "yes"}, "must be true or false"),
    ({"do_remote_decode": True, "do_remote_prefill": True}, "cannot both be true"),
    ({"tp_size": 2}, "tp_size"),
    ({"remote_bogus": 1}, "unknown key"),
])
def test_bad_handshake_fields_are_named(kvp: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(extra_args={"kv_transfer_params": kvp})


def test_n_above_one_cannot_hand_over(ckpt: Path) -> None:
    prod = engine(ckpt, "kv_producer")
    with pytest.raises(ValueError, match=r"n \(2\) must be 1"):
        prod.generate([[11, 12, 13]], SamplingParams(
            n=2, max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}}))


# ---------------------------------------------------------------------------- layerwise
def layerwise_engine(ckpt: Path, budget: int = 64, **extra: Any) -> LLM:
    kt = {"kv_connector": "P2pConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"layerwise": True, **extra}}
    return LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=64, max_num_seqs=4,
               max_num_batched_tokens=budget, max_model_len=128, kv_transfer_config=kt)


@pytest.mark.parametrize("budget", [128, 16])  # all prompts in one step; chunks of 16
def test_layerwise_staging_frees_the_prefill_blocks_at_once(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], budget: int) -> None:
    """Each layer's KV is copied to the host send buffer from inside the forward (chunk by
    chunk under chunked prefill); the prefill instance frees its device blocks when the leg
    finishes, and the decode instance reads the buffer: the same tokens."""
    prod, cons = layerwise_engine(ckpt, budget), engine(ckpt, "kv_consumer")
    outs = prod.generate(prompts, PREFILL)
    handshakes = [o.kv_transfer_params for o in outs]
    assert [k["remote_block_ids"] for k in handshakes] == [  # type: ignore[index]
        list(range(10)), list(range(16)), list(range(2)), list(range(1))]  # places, ceil(P/4)
    sched = prod.engine.scheduler
    assert sched.sending == {} and sched.kv_cache_manager.usage == 0.0  # nothing held
    bpb = prod.engine.bytes_per_block
    p = prod.stats()
    assert p["workbench:kv_transfer_held_blocks"] == 0
    staged = p["workbench:kv_transfer_stage_bytes"] / bpb
    if budget == 128:
        assert staged == 10 + 16 + 2 + 1  # each prompt block copied once
    else:  # a partial block is copied again when the next chunk fills it
        assert staged > 10 + 16 + 2 + 1
    assert sched.connector.buffer_used == 29 * bpb
    got = cons.generate(prompts, [decode_params(k) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    prod.engine.poll_kv_transfers()
    assert sched.connector.buffer_used == 0  # every buffer read and freed
    assert prod.stats()["workbench:kv_transfer_send_bytes"] == (9 + 16 + 1) * bpb


def test_layerwise_without_room_holds_the_blocks_instead(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod = layerwise_engine(ckpt, send_buffer_bytes=1)
    cons = engine(ckpt, "kv_consumer")
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    assert kvp is not None and kvp["remote_block_ids"] == list(range(1, 11))  # device ids
    assert prod.engine.scheduler.sending.keys() == {"0"}
    assert prod.stats()["workbench:kv_transfer_stage_fallbacks"] == 1
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]


def test_an_aborted_staged_leg_gives_its_buffer_back(ckpt: Path,
                                                     prompts: list[list[int]]) -> None:
    prod = layerwise_engine(ckpt, budget=16)
    eng = prod.engine
    req = eng.make_request(prompts[1], PREFILL)  # 64 tokens: 4 chunks of 16
    eng.add_request(req)
    eng.step()  # the first chunk is staged
    conn = eng.scheduler.connector
    assert conn.buffer_used == 16 * eng.bytes_per_block
    eng.abort_request([req.request_id])
    assert conn.has_pending_work()  # the drop goes to the worker with the next step
    eng.step()
    eng.poll_kv_transfers()
    assert conn.buffer_used == 0 and not eng.runner.kv_connector._buffers
    assert req.kv_transfer_params is None


@pytest.mark.parametrize(("extra", "message"), [
    ({"bogus": 1}, "kv_connector_extra_config has unknown key(s) bogus; allowed: "
     "abort_timeout_s, layerwise, load_timeout_s, push_inbox_bytes, push_wait_s, "
     "send_buffer_bytes, side_channel_host, side_channel_port, torch_dist_backend, transport, "
     "trusted_consumers, trusted_producers"),
    ({"transport": "nixl"}, "transport ('nixl') must be one of zmq"),
    ({"side_channel_port": 70000}, "side_channel_port (70000) must be <= 65535"),
    ({"abort_timeout_s": 0}, "abort_timeout_s (0) must be a number > 0"),
    ({"layerwise": "yes"}, "layerwise ('yes') must be true or false"),
    ({"send_buffer_bytes": 0}, "send_buffer_bytes (0) must be an integer >= 1"),
])
def test_bad_p2p_config_is_one_named_error(extra: dict[str, Any], message: str) -> None:
    from workbench.config.kv_transfer import KVTransferConfig

    with pytest.raises(ValueError) as e:
        KVTransferConfig.from_dict({"kv_connector": "P2pConnector", "kv_role": "kv_producer",
                                    "kv_connector_extra_config": extra})
    assert message in str(e.value)


# ------------------------------------------------------------------ whose KV, from whom
def test_a_handshake_is_read_only_by_a_request_with_its_prompt(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """Request B carrying request A's handshake: B's own tokens (recomputed, a failed load,
    nothing contacted), and A's hold is still there for A, whose read succeeds."""
    from workbench.distributed.kv_transfer.p2p_trust import prompt_digest

    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    a, b = prompts[0], prompts[1]
    kvp_a = prod.generate([a], PREFILL)[0].kv_transfer_params
    out = cons.generate([b], decode_params(kvp_a))[0]
    assert list(out.outputs[0].token_ids) == reference[1]  # B's, not A's continuation
    assert kvp_a is not None and kvp_a["prompt_digest"] == prompt_digest(a)
    c = cons.stats()
    assert c["workbench:kv_transfer_failed_recvs"] == 1
    assert c["workbench:kv_transfer_recv_bytes"] == 0
    assert "is another prompt's; not read" in cons.engine.errors[-1]["message"]
    prod.engine.poll_kv_transfers()
    assert prod.engine.scheduler.sending.keys() == {"0"}  # still held for A
    out = cons.generate([a], decode_params(kvp_a))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    c = cons.stats()  # cumulative: A's read did not fail, and read A's 36 tokens
    assert c["workbench:kv_transfer_failed_recvs"] == 1
    assert c["workbench:kv_transfer_recv_bytes"] == 9 * cons.engine.bytes_per_block


def test_the_producer_refuses_a_read_for_another_prompt(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """A handshake whose digest was changed to B's passes the decode side's check; the
    producer compares the read's digest with the held prompt's and refuses: B recomputes."""
    from workbench.distributed.kv_transfer.p2p_trust import prompt_digest

    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    kvp_a = dict(prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params or {})
    forged = {**kvp_a, "prompt_digest": prompt_digest(prompts[1])}
    out = cons.generate(prompts[1:2], decode_params(forged))[0]
    assert list(out.outputs[0].token_ids) == reference[1]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert f"is not the prompt held for '{kvp_a['remote_request_id']}': refused" in \
        cons.engine.errors[-1]["message"]
    assert prod.stats()["workbench:kv_transfer_send_bytes"] == 0


def test_the_cache_salt_is_part_of_the_prompt_digest() -> None:
    from workbench.distributed.kv_transfer.p2p_trust import prompt_digest

    assert prompt_digest([1, 2, 3]) == prompt_digest([1, 2, 3], None) == \
        prompt_digest([1, 2, 3], "")
    assert len({prompt_digest([1, 2, 3]), prompt_digest([1, 2, 3], "tenant-a"),
                prompt_digest([1, 2, 4]), prompt_digest([1, 2])}) == 4


def handshake(host: str, port: int) -> dict[str, Any]:
    return {"do_remote_prefill": True, "remote_engine_id": "e", "remote_request_id": "r",
            "remote_block_ids": [1], "remote_host": host, "remote_port": port}


@pytest.mark.parametrize("host", ["10.1.2.3", "evil.example", "169.254.169.254"])
def test_a_producer_on_another_host_is_not_contacted_by_default(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], host: str) -> None:
    """A handshake naming a producer this decode instance does not trust: nothing is
    connected to, the request recomputes (a failed load naming the key to set)."""
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    kvp = {**(prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params or {}),
           "remote_host": host}
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    c = cons.stats()
    assert c["workbench:kv_transfer_failed_recvs"] == 1
    assert c["workbench:kv_transfer_recv_bytes"] == 0
    trust = cons.engine.runner.kv_connector.trust
    assert trust.describe().startswith("this host only (loopback, ")
    assert "localhost" in trust.describe()
    assert cons.engine.errors[-1]["message"] == (
        f"read for 0 failed: TransferError: remote_host {host!r} (remote_port "
        f"{kvp['remote_port']}) is not a producer this decode instance trusts "
        f"({trust.describe()}): not contacted; list it in kv_transfer_config "
        "kv_connector_extra_config trusted_producers")


def test_trusted_producers_is_the_allow_list(ckpt: Path, prompts: list[list[int]],
                                             reference: list[list[int]]) -> None:
    """Listed: a host at any port, or a host:port; 127.0.0.1 no longer trusted unless
    listed (the local producer is not contacted: its hold stays)."""
    cons = engine(ckpt, "kv_consumer", trusted_producers=["10.1.2.3", "[::1]:5601",
                                                          "LOCALHOST:5602"])
    trust = cons.engine.runner.kv_connector.trust
    assert trust.allows("10.1.2.3", 1) and trust.allows("10.1.2.3", 65535)
    assert trust.allows("::1", 5601) and trust.allows("0:0:0:0:0:0:0:1", 5601)
    assert not trust.allows("::1", 5600)
    assert trust.allows("localhost", 5602) and not trust.allows("127.0.0.1", 5602)
    assert not trust.allows("10.1.2.30", 1)
    assert trust.describe() == "10.1.2.3, ::1:5601, localhost:5602"
    prod = engine(ckpt, "kv_producer")
    kvp = prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert "not contacted" in cons.engine.errors[-1]["message"]
    prod.engine.poll_kv_transfers()
    assert prod.engine.scheduler.sending.keys() == {"0"}  # never read: still held


def test_this_host_is_trusted_by_default(ckpt: Path) -> None:
    import socket

    trust = engine(ckpt, "kv_consumer").engine.scheduler.connector.trust
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost", "0.0.0.0",
                 socket.gethostname()):
        assert trust.allows(host, 5600), host


@pytest.mark.parametrize(("value", "message"), [
    ([], "trusted_producers ([]) must be a non-empty list"),
    ("10.0.0.1", "trusted_producers ('10.0.0.1') must be a non-empty list"),
    (["10.0.0.1:99999"], "trusted_producers entry ('10.0.0.1:99999') must be"),
    (["h:"], "trusted_producers entry ('h:') must be"),
    ([" h"], "trusted_producers entry (' h') must be"),
    (["[::1"], "trusted_producers entry ('[::1') must be"),
    (["http://h"], "trusted_producers entry ('http://h') must be"),
    ([5], "trusted_producers entry (5) must be"),
])
def test_bad_trusted_producers_are_one_named_error(value: Any, message: str) -> None:
    from workbench.config.kv_transfer import KVTransferConfig

    with pytest.raises(ValueError) as e:
        KVTransferConfig.from_dict({"kv_connector": "P2pConnector", "kv_role": "kv_consumer",
                                    "kv_connector_extra_config": {"trusted_producers": value}})
    assert str(e.value).startswith("kv_transfer_config kv_connector_extra_config " + message)


# ------------------------------------------------------------------------- fail fast
def read_header(conn: Any, rid: str, digest: str = "0" * 64) -> dict[str, Any]:
    return {"op": "read", "engine_id": conn.engine_id, "namespace": conn.namespace,
            "request_id": rid, "block_ids": [1], "prompt_digest": digest}


def test_an_unknown_request_is_refused_at_once_not_parked(ckpt: Path,
                                                          prompts: list[list[int]]) -> None:
    """The producer's answer to a read of a request it never had is a refusal (a Reply),
    not None (which parks the read until load_timeout_s)."""
    prod = engine(ckpt, "kv_producer")
    conn = prod.engine.runner.kv_connector
    reply = conn._serve(read_header(conn, "999"))
    assert reply is not None and reply.header == {
        "ok": False, "error": "unknown request '999': no prefill leg of that id on this "
        "instance (never registered, or from before a restart)"}


def test_a_running_prefill_leg_is_parked_and_an_ended_one_refused(
        ckpt: Path, prompts: list[list[int]]) -> None:
    """A leg still prefilling (chunked: 4 steps of 16) is known to the worker from its first
    step: its read waits. Aborted, it is refused at once."""
    from workbench.distributed.kv_transfer.p2p_trust import prompt_digest

    prod = LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=64, max_num_seqs=4,
               max_num_batched_tokens=16, max_model_len=128,
               kv_transfer_config={"kv_connector": "P2pConnector", "kv_role": "kv_producer"})
    eng = prod.engine
    req = eng.make_request(prompts[1], PREFILL)
    eng.add_request(req)
    eng.step()
    conn = eng.runner.kv_connector
    digest = prompt_digest(prompts[1])
    assert conn._serve(read_header(conn, req.request_id, digest)) is None  # parked
    wrong = conn._serve(read_header(conn, req.request_id))
    assert wrong is not None and "is not the prompt held for" in wrong.header["error"]
    eng.abort_request([req.request_id])
    eng.step()
    reply = conn._serve(read_header(conn, req.request_id, digest))
    assert reply is not None and reply.header["error"] == (
        f"the blocks of {req.request_id!r} were not handed over (its prefill did not finish "
        "by length: aborted, stopped or failed)")
    assert conn._legs == {}


def test_a_decode_read_of_an_unknown_request_fails_and_recomputes(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod, cons = engine(ckpt, "kv_producer"), engine(ckpt, "kv_consumer")
    kvp = dict(prod.generate(prompts[:1], PREFILL)[0].kv_transfer_params or {})
    kvp["remote_request_id"] = "999"
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 1
    assert "unknown request '999'" in cons.engine.errors[-1]["message"]

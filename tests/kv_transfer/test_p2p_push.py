"""P2pConnector push: a layerwise prefill instance sends each staged slice to the decode
instance named in the prefill request while the prefill runs; the decode read then finds the
KV in its inbox and only releases the producer's buffer. Same tokens as colocated; a push
that cannot arrive (decode side down, inbox full) falls back to the pull, exactly counted."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kv_transfer import test_p2p as base
from tests.kv_transfer.test_p2p import decode_params, engine, layerwise_engine
from workbench import LLM
from workbench.sampling_params import SamplingParams

ckpt, prompts, reference = base.ckpt, base.prompts, base.reference  # the same fixtures

PUSHED_BLOCKS = 10 + 16 + 2 + 1  # ceil(P / 4) for the four prompts: every block pushed once
READ_BLOCKS = 9 + 16 + 1  # ceil((P - 1) / 4): what the decode side needs (the last recomputed)


def push_prefill(host: str, port: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, extra_args={
        "kv_transfer_params": {"do_remote_decode": True, "remote_host": host,
                               "remote_port": port}})


def inbox_done(cons: LLM, count: int, timeout_s: float = 10.0) -> int:
    """Wait (bounded) until `count` pushed prefills are complete in the consumer's inbox."""
    inbox = cons.engine.runner.kv_connector._inbox
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with inbox._cond:
            done = sum(e.done for e in inbox._entries.values())
        if done >= count:
            break
        time.sleep(0.01)
    return done


def inbox_refused(cons: LLM, count: int, timeout_s: float = 10.0) -> int:
    """Wait (bounded) until the consumer's inbox has refused `count` pushed prefills (a
    refusal is counted at the engine's next step: one landing after the last step of a
    generate() would be missing from its stats)."""
    inbox = cons.engine.runner.kv_connector._inbox
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with inbox._cond:
            refused = len(inbox._refused)
        if refused >= count:
            break
        time.sleep(0.01)
    return refused


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("budget", [128, 16])  # all prompts in one step; chunks of 16
def test_pushed_kv_decodes_the_same_tokens_without_a_pull(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], budget: int) -> None:
    cons = engine(ckpt, "kv_consumer")
    info = cons.engine.kv_transfer_info()
    assert info is not None and info["kv_role"] == "kv_consumer" and not info["layerwise"]
    prod = layerwise_engine(ckpt, budget)
    assert prod.engine.kv_transfer_info()["layerwise"] is True  # type: ignore[index]
    outs = prod.generate(prompts, push_prefill(info["side_channel_host"],
                                               info["side_channel_port"]))
    handshakes = [o.kv_transfer_params for o in outs]
    assert inbox_done(cons, 4) == 4
    bpb = prod.engine.bytes_per_block
    p = prod.stats()
    assert p["workbench:kv_transfer_push_drops"] == 0
    # every staged slice went out (a partial block again when the next chunk filled it)
    assert p["workbench:kv_transfer_push_bytes"] == p["workbench:kv_transfer_stage_bytes"]
    if budget == 128:
        assert p["workbench:kv_transfer_push_bytes"] == PUSHED_BLOCKS * bpb
    side = f"{info['side_channel_host']}:{info['side_channel_port']}"
    assert [k["pushed_to"] for k in handshakes] == [side] * 4  # type: ignore[index]
    got = cons.generate(prompts, [decode_params(k) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    c = cons.stats()
    assert c["workbench:kv_transfer_pushed_loads"] == 3  # the 1-token prompt reads nothing
    assert c["workbench:kv_transfer_recv_bytes"] == READ_BLOCKS * bpb
    assert c["workbench:kv_transfer_failed_recvs"] == 0
    prod.engine.poll_kv_transfers()
    p = prod.stats()
    assert p["workbench:kv_transfer_sends"] == 4  # each buffer released, none read
    assert p["workbench:kv_transfer_send_bytes"] == 0
    assert prod.engine.scheduler.connector.buffer_used == 0
    assert cons.engine.runner.kv_connector._inbox.used == 0  # every entry taken


def test_a_push_to_a_decode_instance_that_is_down_falls_back_to_the_pull(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    prod = layerwise_engine(ckpt)
    handshakes = [o.kv_transfer_params for o in
                  prod.generate(prompts, push_prefill("127.0.0.1", free_port()))]
    p = prod.stats()
    assert p["workbench:kv_transfer_push_drops"] == 4  # each leg dropped at its first slice
    assert p["workbench:kv_transfer_push_bytes"] == 0
    cons = engine(ckpt, "kv_consumer")  # another decode instance: it pulls
    got = cons.generate(prompts, [decode_params(k) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    assert cons.stats()["workbench:kv_transfer_pushed_loads"] == 0
    prod.engine.poll_kv_transfers()
    assert prod.stats()["workbench:kv_transfer_send_bytes"] == READ_BLOCKS \
        * prod.engine.bytes_per_block


def test_decode_requests_sent_at_once_wait_for_pushes_still_on_the_wire(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """No wait between the legs (as the router and the bench do): the handshake's
    `pushed_to` names this consumer, so its reads wait for the pushes instead of pulling."""
    cons = engine(ckpt, "kv_consumer", push_wait_s=60.0)
    info: dict[str, Any] = cons.engine.kv_transfer_info()  # type: ignore[assignment]
    prod = layerwise_engine(ckpt)
    handshakes = [o.kv_transfer_params for o in prod.generate(
        prompts, push_prefill(info["side_channel_host"], info["side_channel_port"]))]
    got = cons.generate(prompts, [decode_params(k) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    c = cons.stats()
    assert c["workbench:kv_transfer_pushed_loads"] == 3  # the 1-token prompt reads nothing
    assert c["workbench:kv_transfer_recv_bytes"] == READ_BLOCKS * prod.engine.bytes_per_block
    assert c["workbench:kv_transfer_push_drops"] == 0


def test_a_full_inbox_drops_the_push_and_the_read_pulls(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    cons = engine(ckpt, "kv_consumer", push_inbox_bytes=1)
    info: dict[str, Any] = cons.engine.kv_transfer_info()  # type: ignore[assignment]
    prod = layerwise_engine(ckpt)
    handshakes = [o.kv_transfer_params for o in prod.generate(
        prompts, push_prefill(info["side_channel_host"], info["side_channel_port"]))]
    # every push refused before the reads (under load one landed after the last step: 3/4)
    assert inbox_refused(cons, len(prompts)) == len(prompts)
    got = cons.generate(prompts, [decode_params(k) for k in handshakes])
    assert [list(o.outputs[0].token_ids) for o in got] == reference
    c = cons.stats()
    assert c["workbench:kv_transfer_pushed_loads"] == 0
    assert c["workbench:kv_transfer_push_drops"] == 4  # refused at the inbox, all four
    assert c["workbench:kv_transfer_recv_bytes"] == READ_BLOCKS * prod.engine.bytes_per_block


@pytest.mark.parametrize(("kvp", "message"), [
    ({"do_remote_decode": True, "remote_host": "127.0.0.1"},
     "need remote_host and remote_port together"),
    ({"do_remote_decode": True, "remote_host": "", "remote_port": 5},
     "remote_host ('') must be a non-empty string"),
    ({"do_remote_decode": True, "remote_host": "h", "remote_port": 70000},
     "remote_port (70000) must be an integer in 1..65535"),
])
def test_a_bad_push_target_is_named(kvp: dict[str, Any], message: str) -> None:
    from workbench.config.kv_transfer_params import kv_transfer_params

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kv_transfer_params({"kv_transfer_params": kvp})
    assert kv_transfer_params({"kv_transfer_params": {  # vLLM's proxy sends them as null
        "do_remote_decode": True, "remote_host": None, "remote_port": None}})


def test_pushed_kv_is_not_taken_by_a_request_with_another_prompt(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """B names A's pushed prefill with B's digest: the inbox keeps A's KV, the pull is
    refused by the producer (A's prompt is held), B recomputes; A then decodes from its
    push."""
    from workbench.distributed.kv_transfer.p2p_trust import prompt_digest

    cons = engine(ckpt, "kv_consumer")
    info = cons.engine.kv_transfer_info()
    assert info is not None
    prod = layerwise_engine(ckpt)
    kvp_a = prod.generate(prompts[:1], push_prefill(info["side_channel_host"],
                                                    info["side_channel_port"]))[0]
    assert kvp_a.kv_transfer_params is not None
    assert inbox_done(cons, 1) == 1
    forged = {**kvp_a.kv_transfer_params, "prompt_digest": prompt_digest(prompts[1])}
    out = cons.generate(prompts[1:2], decode_params(forged))[0]
    assert list(out.outputs[0].token_ids) == reference[1]
    c = cons.stats()
    assert c["workbench:kv_transfer_failed_recvs"] == 1
    assert c["workbench:kv_transfer_pushed_loads"] == 0
    assert "is not the prompt held for" in cons.engine.errors[-1]["message"]
    out = cons.generate(prompts[:1], decode_params(kvp_a.kv_transfer_params))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    c = cons.stats()
    assert c["workbench:kv_transfer_pushed_loads"] == 1
    assert c["workbench:kv_transfer_failed_recvs"] == 1


def test_a_push_target_on_another_host_gets_no_push_and_pulls(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """A prefill request naming a push target the producer does not trust (a client calling
    the prefill instance directly): nothing is sent there, the leg is counted dropped, and
    its decode instance pulls."""
    prod = layerwise_engine(ckpt)
    kvp = prod.generate(prompts[:1], push_prefill("10.1.2.3", 5600))[0].kv_transfer_params
    assert kvp is not None and "pushed_to" not in kvp
    p = prod.stats()
    assert p["workbench:kv_transfer_push_drops"] == 1
    assert p["workbench:kv_transfer_push_bytes"] == 0
    cons = engine(ckpt, "kv_consumer")
    out = cons.generate(prompts[:1], decode_params(kvp))[0]
    assert list(out.outputs[0].token_ids) == reference[0]
    assert cons.stats()["workbench:kv_transfer_failed_recvs"] == 0


def test_trusted_consumers_lists_the_push_targets(ckpt: Path) -> None:
    prod = layerwise_engine(ckpt, trusted_consumers=["10.1.2.3:5600"])
    trust = prod.engine.scheduler.connector.push_trust
    assert trust.allows("10.1.2.3", 5600) and not trust.allows("10.1.2.3", 5601)
    assert not trust.allows("127.0.0.1", 5600)  # listed: exactly the list
    with pytest.raises(ValueError, match=r"trusted_consumers entry \('a b'\) must be"):
        layerwise_engine(ckpt, trusted_consumers=["a b"])


def test_a_push_from_an_untrusted_producer_is_dropped(ckpt: Path,
                                                      prompts: list[list[int]]) -> None:
    """The decode instance takes pushes only from producers it trusts (by the address the
    socket saw): with 127.0.0.1 not listed, a local producer's push never enters the inbox."""
    cons = engine(ckpt, "kv_consumer", trusted_producers=["10.1.2.3"])
    info = cons.engine.kv_transfer_info()
    assert info is not None
    prod = layerwise_engine(ckpt)
    prod.generate(prompts[:1], push_prefill(info["side_channel_host"],
                                            info["side_channel_port"]))
    conn = cons.engine.runner.kv_connector
    deadline = time.monotonic() + 10.0  # the push's messages reach the server thread
    while time.monotonic() < deadline and not conn._errors:
        time.sleep(0.01)
    assert conn._errors[0] == ("push from 127.0.0.1 dropped: not a producer this decode "
                               "instance trusts (10.1.2.3)")
    assert conn._inbox._entries == {} and conn._inbox.used == 0
    assert conn.trust.allows_host("10.1.2.3") and not conn.trust.allows_host(None)

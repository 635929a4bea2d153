"""`--kv-push` on scripted replicas: the decode replica is chosen before the prefill leg, its
side channel (GET /kv_transfer_info, asked once) goes in the prefill request, and the decode
leg's first attempt goes to that replica; a replica without a side channel gets the pull
flow; a pushed-to replica that died is retried elsewhere without KV; exact counters."""

from __future__ import annotations

from tests.router.fakes import FakeReplica
from tests.router.test_disagg import BODY, disagg, post, stream, text_of
from workbench.harness import prom
from workbench.router.disagg import PREFILL_KV_TRANSFER_PARAMS

PUSHED = {**PREFILL_KV_TRANSFER_PARAMS, "remote_host": "d0-kv", "remote_port": 5700}


def info_asks(replica: FakeReplica) -> int:
    return sum(s.path == "/kv_transfer_info" for s in replica.seen)


def test_the_prefill_pushes_to_the_decode_replica_that_then_decodes() -> None:
    with disagg(1, 2, decode_policy="round_robin", kv_push=True) as (client, (p0,), (d0, d1),
                                                                        router):
        post(client, BODY)
        events = stream(client, BODY)
        post(client, BODY)
        assert text_of(events)
        sent = [s.body["kv_transfer_params"] for s in p0.completions]
        assert sent == [PUSHED, {**PUSHED, "remote_host": "d1-kv"}, PUSHED]
        # each decode leg went where its prefill pushed, with the prefill's handshake
        assert [len(d0.completions), len(d1.completions)] == [2, 1]
        assert all(s.body["kv_transfer_params"] == p0.kv_params
                   for s in [*d0.completions, *d1.completions])
        assert [r.pushed_to for r in router.records] == [1, 2, 1]
        assert [r.decode_replicas for r in router.records] == [[1], [2], [1]]
        assert (info_asks(d0), info_asks(d1)) == (1, 1)  # cached per replica
        assert [r.outstanding for r in router.pool.replicas] == [0, 0, 0]
        assert [r.requests_total for r in router.pool.replicas] == [3, 2, 1]
        flat = prom.parse(client.get("/metrics").text)
        assert flat["workbench:disagg_kv_push_requests_total"] == 3.0
        assert flat["workbench:disagg_kv_push_misses_total"] == 0.0
        assert client.get("/router/replicas").json()["kv_push"] is True


def test_a_decode_replica_without_a_side_channel_gets_the_pull_flow() -> None:
    with disagg(1, 1, kv_push=True) as (client, (p0,), (d0,), router):
        d0.side_channel = None
        post(client, BODY)
        post(client, BODY)
        assert [s.body["kv_transfer_params"] for s in p0.completions] == \
            [PREFILL_KV_TRANSFER_PARAMS] * 2
        assert info_asks(d0) == 1  # its 404 is remembered too
        assert [r.pushed_to for r in router.records] == [None, None]
        assert [r.decode_replicas for r in router.records] == [[1], [1]]
        assert [r.outstanding for r in router.pool.replicas] == [0, 0]
        assert router.pool.replicas[1].requests_total == 2
        assert router.push_requests == 0


def test_a_pushed_to_replica_that_died_is_retried_elsewhere_without_kv() -> None:
    with disagg(1, 2, decode_policy="round_robin", kv_push=True) as (client, (p0,), (d0, d1),
                                                                        router):
        post(client, BODY)  # d0's side channel known
        post(client, BODY)  # d1's
        d0.mode = "refuse"
        out = post(client, BODY)
        assert out["choices"][0]["text"]
        record = router.records[-1]
        assert record.pushed_to == 1 and record.decode_replicas == [1, 2]
        assert p0.completions[-1].body["kv_transfer_params"] == PUSHED
        # the retry recomputes the prompt: no handshake on the other replica
        assert "kv_transfer_params" not in d1.completions[-1].body
        assert not router.pool.replicas[1].alive
        assert [r.outstanding for r in router.pool.replicas] == [0, 0, 0]
        # the dead replica's side channel is forgotten; later pushes go to the live one
        post(client, BODY)
        assert p0.completions[-1].body["kv_transfer_params"] == \
            {**PUSHED, "remote_host": "d1-kv"}
        assert router.records[-1].decode_replicas == [2]

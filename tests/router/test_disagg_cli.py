"""Disaggregated prefill/decode: RouterConfig fields, `workbench router --num-prefill ...` /
`workbench disagg`, and the replicas' per-side --kv-transfer-config."""

from __future__ import annotations

import json

import pytest

from workbench.config.named_models import bundled_checkpoint
from workbench.router.cli import parse_args
from workbench.router.config import RouterConfig
from workbench.router.disagg_pool import (
    disagg_pool,
    role_kv_transfer_config,
    split_kv_transfer_config,
    url_pool,
)

MODEL = str(bundled_checkpoint())
PRODUCER = {"kv_connector": "P2pConnector", "kv_role": "kv_producer"}
CONSUMER = {"kv_connector": "P2pConnector", "kv_role": "kv_consumer"}


def test_config_counts_prefill_plus_decode_replicas_and_workers() -> None:
    c = RouterConfig(num_prefill=3, num_decode=1, tensor_parallel_size=2)
    assert (c.disaggregated, c.num_replicas, c.num_workers) == (True, 4, 8)
    assert (c.prefill_policy, c.decode_policy) == ("prefix_aware", "least_outstanding")
    colocated = RouterConfig(num_replicas=4, tensor_parallel_size=2)
    assert (colocated.disaggregated, colocated.num_workers) == (False, 8)  # same workers
    assert c.make_policy(c.prefill_policy).name == "prefix_aware"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_prefill": 1}, "num_prefill (1) and num_decode (0) must both be >= 1 "
                         "(disaggregated prefill/decode) or both 0 (colocated replicas)"),
    ({"num_prefill": -1, "num_decode": 1}, "num_prefill (-1) must be an integer >= 0"),
    ({"num_prefill": 1, "num_decode": True}, "num_decode (True) must be an integer >= 0"),
    ({"num_prefill": 1, "num_decode": 1, "prefill_policy": "random"},
     "prefill_policy ('random') must be one of round_robin, least_outstanding, prefix_aware"),
    ({"num_prefill": 1, "num_decode": 1, "decode_policy": "prefix_aware"},
     "decode_policy ('prefix_aware') must be one of round_robin, least_outstanding"),
])
def test_config_refuses_bad_disaggregation_fields(kwargs: dict[str, object],
                                                  message: str) -> None:
    with pytest.raises(ValueError) as e:
        RouterConfig(**kwargs)  # type: ignore[arg-type]
    assert str(e.value).startswith(message)


def test_each_side_gets_its_role_and_the_users_extra_config_is_kept() -> None:
    assert role_kv_transfer_config(None, "prefill") == PRODUCER
    assert role_kv_transfer_config(None, "decode") == CONSUMER
    user = {"kv_role": "kv_both", "kv_connector_extra_config": {"port": 5600}}
    assert role_kv_transfer_config(user, "decode") == {**CONSUMER,
                                                       "kv_connector_extra_config": {"port": 5600}}
    assert role_kv_transfer_config({"kv_connector": "MyConnector"}, "prefill") == {
        "kv_connector": "MyConnector", "kv_role": "kv_producer"}
    with pytest.raises(ValueError, match=r"role \('both'\) must be one of prefill, decode"):
        role_kv_transfer_config(None, "both")


def test_the_users_kv_transfer_config_is_split_from_the_shared_flags() -> None:
    args = ["--model", "M", "--kv-transfer-config", '{"kv_connector_extra_config": {}}', "-x"]
    assert split_kv_transfer_config(args) == (["--model", "M", "-x"],
                                              {"kv_connector_extra_config": {}})
    assert split_kv_transfer_config(["--kv-transfer-config={}"]) == ([], {})
    assert split_kv_transfer_config(["--model", "M"]) == (["--model", "M"], None)
    with pytest.raises(ValueError, match=r"kv_transfer_config \('\{x'\) is not JSON"):
        split_kv_transfer_config(["--kv-transfer-config", "{x"])
    with pytest.raises(ValueError, match=r"kv_transfer_config \('\[1\]'\) must be a JSON object"):
        split_kv_transfer_config(["--kv-transfer-config", "[1]"])


def test_pool_launches_prefill_then_decode_replicas_with_their_configs() -> None:
    pool = disagg_pool(["--model", "M"], 2, 1, {"kv_connector_extra_config": {"a": 1}},
                       ports=[9001, 9002, 9003])
    assert [r.role for r in pool.replicas] == ["prefill", "prefill", "decode"]
    extra = {"kv_connector_extra_config": {"a": 1}}
    for r, expected in zip(pool.replicas, [PRODUCER, PRODUCER, CONSUMER], strict=True):
        cmd = r.process.command  # type: ignore[union-attr]
        i = cmd.index("--kv-transfer-config")
        assert cmd[cmd.index("serve") + 1: i] == ["--model", "M"]
        assert json.loads(cmd[i + 1]) == {**expected, **extra}
        assert cmd[i + 2:] == ["--host", "127.0.0.1", "--port", str(r.base_url[-4:])]
    with pytest.raises(ValueError, match="serve_args hold --kv-transfer-config"):
        disagg_pool(["--kv-transfer-config", "{}"], 1, 1)
    urls = url_pool(["http://a:1/v1"], ["http://b:2", "http://c:3/"])
    assert [(r.role, r.base_url) for r in urls.replicas] == [
        ("prefill", "http://a:1"), ("decode", "http://b:2"), ("decode", "http://c:3")]


def test_disaggregation_flags_select_the_mode() -> None:
    kt = '{"kv_connector_extra_config": {"port": 7}}'
    args, config, serve, folder = parse_args([
        "--num-prefill", "2", "--num-decode", "3", "--prefill-policy", "round_robin",
        "--decode-policy", "round_robin", "--model", MODEL, "--kv-transfer-config", kt,
        "--num-workers", "5"])
    assert (config.num_prefill, config.num_decode, config.num_replicas, config.num_workers) == (
        2, 3, 5, 5)
    assert (config.prefill_policy, config.decode_policy) == ("round_robin", "round_robin")
    assert serve == ["--model", MODEL, "--log-level", "warning"] and folder == MODEL
    assert args.kv_transfer_config == {"kv_connector_extra_config": {"port": 7}}
    _, config, _, _ = parse_args(["--model", MODEL], disaggregated=True)  # `workbench disagg`
    assert (config.num_prefill, config.num_decode) == (1, 1)
    assert (config.prefill_policy, config.decode_policy) == ("prefix_aware", "least_outstanding")
    args, config, _, _ = parse_args(["--model", MODEL, "--prefill-url", "http://a:1",
                                     "--prefill-url", "http://b:2", "--decode-url", "http://c:3"])
    assert (config.num_prefill, config.num_decode) == (2, 1)
    args, config, serve, _ = parse_args(["--model", MODEL, "--num-replicas", "3"])
    assert (config.disaggregated, config.num_replicas, args.kv_transfer_config) == (False, 3, None)


@pytest.mark.parametrize(("argv", "message"), [
    (["--num-prefill", "1", "--num-replicas", "2"],
     "num_replicas (2) is the colocated router's; with disaggregated prefill/decode give "
     "--num-prefill and --num-decode"),
    (["--decode-url", "http://a:1", "--replica-url", "http://b:1"],
     "replica_url (['http://b:1']) is the colocated router's"),
    (["--prefill-url", "http://a:1"],
     "prefill_url (['http://a:1']) and decode_url (None) must both be given"),
    (["--prefill-url", "http://a:1", "--decode-url", "http://b:1", "--num-decode", "2"],
     "num_prefill (None) / num_decode (2) start replicas; --prefill-url and --decode-url "
     "name running ones"),
    (["--num-prefill", "-1"], "num_prefill (-1) must be an integer >= 1 with disaggregated"),
    (["--num-prefill", "1", "--num-decode", "2", "--num-workers", "4"],
     "num_workers (4) contradicts (num_prefill (1) + num_decode (2)) x tensor_parallel_size "
     "(1) = 3"),
    (["--num-prefill", "1", "--kv-transfer-config", "nope"],
     "kv_transfer_config ('nope') is not JSON"),
    (["--num-prefill", "1", "--decode-policy", "prefix_aware"],
     "argument --decode-policy: invalid choice: 'prefix_aware'"),
])
def test_bad_disaggregation_flags_are_one_error_line(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", MODEL, *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err


def test_workbench_disagg_is_the_router_in_disaggregated_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench import cli
    from workbench.router import disagg_cli

    seen: list[tuple[list[str] | None, bool]] = []
    monkeypatch.setattr(disagg_cli, "router_main",
                        lambda argv, disaggregated=False: seen.append((argv, disaggregated)))
    cli.COMMANDS["disagg"][1](["--model", "M"])
    assert seen == [(["--model", "M"], True)]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--num-workers", "2", "--num-prefill", "0"], (2, 0, 0, False)),  # colocated, 2 replicas
    (["--num-workers", "2", "--num-prefill", "1"], (2, 1, 1, True)),  # decode = W - P
    (["--num-workers", "3", "--num-prefill", "1"], (3, 1, 2, True)),
    (["--num-workers", "3", "--num-prefill", "2"], (3, 2, 1, True)),
])
def test_num_prefill_is_the_one_knob_at_a_fixed_worker_count(
        flags: list[str], expected: tuple[int, int, int, bool]) -> None:
    _, c, _, _ = parse_args(["--model", MODEL, *flags])
    assert (c.num_replicas, c.num_prefill, c.num_decode, c.disaggregated) == expected
    assert c.num_workers == expected[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--num-workers", "2", "--num-prefill", "2"], "num_decode (0) must be an integer >= 1"),
    (["--num-prefill", "0", "--num-decode", "2"], "num_decode (2) needs num_prefill >= 1"),
])
def test_num_prefill_contradictions_are_one_line(
        flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", MODEL, *flags])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_disagg_verb_refuses_num_prefill_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model", MODEL, "--num-prefill", "0"], disaggregated=True)
    assert "num_prefill (0) must be an integer >= 1" in capsys.readouterr().err


def test_kv_push_makes_the_prefill_side_layerwise_and_is_a_flag() -> None:
    user = {"kv_connector_extra_config": {"abort_timeout_s": 9}}
    assert role_kv_transfer_config(user, "prefill", kv_push=True) == {
        **PRODUCER, "kv_connector_extra_config": {"abort_timeout_s": 9, "layerwise": True}}
    assert role_kv_transfer_config(user, "decode", kv_push=True) == {**CONSUMER, **user}
    with pytest.raises(ValueError, match='kv_push needs kv_connector_extra_config layerwise '
                                         'true on the prefill side'):
        role_kv_transfer_config({"kv_connector_extra_config": {"layerwise": False}}, "prefill",
                                kv_push=True)
    _, config, _, _ = parse_args(["--num-prefill", "1", "--kv-push", "--model", MODEL])
    assert config.kv_push is True
    _, config, _, _ = parse_args(["--num-prefill", "1", "--no-kv-push", "--model", MODEL])
    assert config.kv_push is False
    with pytest.raises(ValueError, match=r"kv_push needs disaggregated prefill/decode"):
        RouterConfig(num_replicas=2, kv_push=True)

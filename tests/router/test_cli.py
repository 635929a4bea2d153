"""`workbench router` flags: the router's own vs the replicas' `workbench serve` flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.config.named_models import bundled_checkpoint
from workbench.router.cli import ROUTER_KNOBS, build_parser, parse_args


def test_router_flags_are_split_from_the_replicas_serve_flags() -> None:
    model = str(bundled_checkpoint())
    args, config, serve, folder = parse_args([
        "--num-replicas", "3", "--policy", "prefix_aware", "--port", "8123", "--model", model,
        "--block-size", "8", "--max-num-seqs", "4", "--scheduling-policy", "priority",
        "--prefix-blocks", "2"])
    assert (config.num_replicas, config.policy, config.prefix_blocks) == (3, "prefix_aware", 2)
    assert config.block_size == 8  # the key's block size follows the replicas' engine
    assert (args.port, args.host, folder) == (8123, "127.0.0.1", model)
    assert serve == ["--model", model, "--block-size", "8", "--max-num-seqs", "4",
                     "--policy", "priority", "--log-level", "warning"]
    _, config, _, _ = parse_args(["--routing-policy", "least_outstanding", "--model", model,
                                  "--prefix-block-size", "4"])
    assert (config.policy, config.block_size, config.num_replicas) == ("least_outstanding", 4, 2)


def test_bad_flags_are_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(bundled_checkpoint())
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", model, "--block-size", "7"])
    assert e.value.code == 2 and "block_size (7) must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", model, "--num-replicas", "0"])
    assert e.value.code == 2 and "num_replicas (0) must be an integer >= 1" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        parse_args(["--model", model, "--policy", "random"])


def test_template_target_runs_with_this_interpreter_on_another_port() -> None:
    import sys

    from workbench.experiments.studies.targets import local_target
    from workbench.experiments.template import load_template

    t = load_template(Path(__file__).parents[2] / "experiments" / "routing_policy.yaml")
    assert t.target["command"][:2] == ["workbench", "router"]
    assert t.baseline["policy"] == "round_robin" and t.variable_values == ["prefix_aware"]
    spec = local_target(t.target, port=8199, num_replicas=3, model="bundled")
    assert spec["command"][:4] == [sys.executable, "-m", "workbench.cli", "router"]
    cmd = spec["command"]
    assert cmd[cmd.index("--port") + 1] == "8199" and spec["base_url"].endswith(":8199/v1")
    assert cmd[cmd.index("--num-replicas") + 1] == "3"
    assert cmd[cmd.index("--model") + 1] == cmd[cmd.index("--served-model-name") + 1] == "bundled"
    assert spec["model"] == spec["tokenizer"] == "bundled"
    assert t.target["command"][0] == "workbench"  # the template's own spec is left alone
    # the router parses what the runner appends (engine knobs and the routing policy)
    from workbench.harness.server_process import server_command_for

    argv = server_command_for(spec, t.variant_config("prefix_aware"))[4:]
    _, config, serve, _ = parse_args(argv)
    assert (config.policy, config.num_replicas, config.prefix_blocks) == ("prefix_aware", 3, 4)
    assert "--enable-prefix-caching" in serve and "--policy" not in serve


def test_router_knobs_name_every_router_only_flag() -> None:
    dests = {a.dest for a in build_parser()._actions} - {"help", "host", "port", "log_level"}
    assert dests <= set(ROUTER_KNOBS)


def test_num_workers_fixes_the_worker_count_while_tp_varies(
        capsys: pytest.CaptureFixture[str]) -> None:
    model = str(bundled_checkpoint())  # 4 heads, 2 KV heads: TP 2 fits
    _, config, serve, _ = parse_args(["--model", model, "--num-workers", "2",
                                      "--tensor-parallel-size", "2"])
    assert (config.num_replicas, config.tensor_parallel_size, config.num_workers) == (1, 2, 2)
    assert serve[serve.index("--tensor-parallel-size") + 1] == "2"  # the replica's engine knob
    _, config, _, _ = parse_args(["--model", model, "--num-workers", "2"])
    assert (config.num_replicas, config.tensor_parallel_size, config.num_workers) == (2, 1, 2)
    _, config, _, _ = parse_args(["--model", model, "--num-workers", "4", "--num-replicas", "2",
                                  "--tensor-parallel-size", "2"])
    assert config.num_replicas == 2
    for argv, message in (
            (["--num-workers", "3", "--tensor-parallel-size", "2"],
             "num_workers (3) must be a multiple of tensor_parallel_size (2)"),
            (["--num-workers", "2", "--num-replicas", "2", "--tensor-parallel-size", "2"],
             "num_replicas (2) contradicts num_workers (2) / tensor_parallel_size (2) = 1"),
            (["--num-workers", "0"], "num_workers (0) must be an integer >= 1")):
        with pytest.raises(SystemExit) as e:
            parse_args(["--model", model, *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_tp_rank_takes_omp_num_threads_as_a_replica_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from workbench.executor.multiproc_executor import threads_per_rank

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads_per_rank(2) == 1 and threads_per_rank(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_per_rank(2) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert (threads_per_rank(1), threads_per_rank(2), threads_per_rank(32)) == (16, 8, 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "zero")  # not a count: the equal share
    assert threads_per_rank(4) == 4


def test_tp_vs_replicas_template_changes_tp_at_a_fixed_worker_count() -> None:
    from workbench.experiments.studies.targets import local_target
    from workbench.experiments.template import load_template
    from workbench.harness.server_process import server_command_for

    t = load_template(Path(__file__).parents[2] / "experiments" / "tp_vs_replicas.yaml")
    assert t.variable_name == "tensor_parallel_size" and t.variable_values == [2]
    spec = local_target(t.target, port=8198)
    layouts = []
    for cfg in (t.baseline, t.variant_config(2)):
        _, config, serve, _ = parse_args(server_command_for(spec, cfg)[4:])
        layouts.append((config.num_workers, config.num_replicas, config.tensor_parallel_size,
                        config.replica_threads, config.policy))
        assert "--num-workers" not in serve  # the router's, not the replicas'
    assert layouts == [(2, 2, 1, 1, "least_outstanding"), (2, 1, 2, 1, "least_outstanding")]


def test_layout_row_takes_the_tails_and_the_efficiency_against_one_worker() -> None:
    from workbench.analysis.replicas import LAYOUT_METRICS, layout_row

    metrics = {k: float(i) for i, k in enumerate(LAYOUT_METRICS, start=1)}
    metrics["output_throughput"] = 300.0
    row = layout_row("2 replicas", metrics, True, 2, throughput_1=200.0)
    assert row["scaling_efficiency"] == 0.75 and row["valid"] is True
    assert (row["layout"], row["num_workers"], row["p99_tpot_ms"]) == ("2 replicas", 2, 7.0)
    import math

    assert math.isnan(layout_row("x", metrics, False, 2)["scaling_efficiency"])
    with pytest.raises(ValueError, match="metrics lack p99_ttft_ms"):
        layout_row("x", {k: v for k, v in metrics.items() if k != "p99_ttft_ms"}, True, 2)


@pytest.mark.parametrize(("argv", "message"), [
    (["--address", "10.0.0.1:6379"], "address ('10.0.0.1:6379') places replicas on a Ray "
                                     "cluster: it needs --executor ray"),
    (["--replica-num-cpus", "0.5"], "replica_num_cpus (0.5) places replicas on a Ray cluster: "
                                    "it needs --executor ray"),
    (["--executor", "ray", "--replica-url", "http://a:1"],
     "replica_url (['http://a:1']) routes to running servers; --executor ray starts the "
     "replicas as Ray actors: give one or the other"),
    (["--executor", "ray", "--prefill-url", "http://a:1", "--decode-url", "http://b:1"],
     "prefill_url (['http://a:1']) routes to running servers; --executor ray starts the "
     "replicas as Ray actors: give one or the other"),
    (["--executor", "ray", "--replica-log-dir", "logs"],
     "replica_log_dir (logs) names a log folder on this machine (Ray keeps each replica's log "
     "on its node); --executor ray starts the replicas as Ray actors: give one or the other"),
    (["--executor", "ray", "--replica-resources", "{node: 1}"],
     "replica_resources ('{node: 1}') is not JSON: Expecting property name enclosed in double "
     "quotes: line 1 column 2 (char 1)"),
])
def test_ray_placement_flags_are_one_error_line(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.router.config.ray_installed", lambda: True)
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", str(bundled_checkpoint()), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1] == f"workbench router: error: {message}"


def test_executor_ray_is_a_router_flag_and_the_bundle_follows_tp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.router.config.ray_installed", lambda: True)
    from workbench.router.cli import _ray_pool

    model = str(bundled_checkpoint())
    args, config, serve, _ = parse_args([
        "--model", model, "--executor", "ray", "--address", "10.0.0.1:6379",
        "--num-workers", "4", "--tensor-parallel-size", "2", "--replica-threads", "3",
        "--replica-resources", '{"workbench_node": 1}'])
    assert (config.executor, config.address, config.num_replicas) == ("ray", "10.0.0.1:6379", 2)
    assert "--executor" not in serve and "--address" not in serve
    pool = _ray_pool(args, config, serve)  # nothing starts before `start()`
    assert (len(pool), pool.address, pool.threads) == (2, "10.0.0.1:6379", 3)
    assert pool.bundle == {"CPU": 6.0, "workbench_node": 1}  # 3 threads x 2 "mp" ranks
    args, config, serve, _ = parse_args([
        "--model", model, "--executor", "ray", "--num-prefill", "1", "--num-decode", "2",
        "--replica-num-cpus", "0.5"])
    pool = _ray_pool(args, config, serve)
    assert [r.role for r in pool.replicas] == ["prefill", "decode", "decode"]
    assert pool.bundle == {"CPU": 0.5}
    assert [json.loads(e[1])["kv_role"] for e in pool.extra] == [
        "kv_producer", "kv_consumer", "kv_consumer"]


def test_executor_ray_without_ray_is_one_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.router.config.ray_installed", lambda: False)
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", str(bundled_checkpoint()), "--executor", "ray"], True)
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1] == (
        "workbench disagg: error: --executor ray needs Ray, which is not installed: "
        "pip install -e '.[cluster]'")

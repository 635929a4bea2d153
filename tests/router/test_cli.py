"""`workbench router` flags: the router's own vs the replicas' `workbench serve` flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.demo import bundled_checkpoint
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

    from workbench.experiments.template import load_template
    from workbench.router.experiment import local_target

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
    from workbench.bench.server_process import server_command_for

    argv = server_command_for(spec, t.variant_config("prefix_aware"))[4:]
    _, config, serve, _ = parse_args(argv)
    assert (config.policy, config.num_replicas, config.prefix_blocks) == ("prefix_aware", 3, 4)
    assert "--enable-prefix-caching" in serve and "--policy" not in serve


def test_router_knobs_name_every_router_only_flag() -> None:
    dests = {a.dest for a in build_parser()._actions} - {"help", "host", "port", "log_level"}
    assert dests <= set(ROUTER_KNOBS)

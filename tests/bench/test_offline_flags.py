"""`workbench bench offline` takes the engine's knobs from engine_args, as `workbench serve`."""

from __future__ import annotations

import pytest

from workbench.bench.offline.throughput import ENGINE_FIXED, parse_args
from workbench.engine.arg_utils import engine_knobs, engine_kwargs


def test_every_engine_knob_but_the_fixed_ones_is_a_flag() -> None:
    args = parse_args([])
    assert ENGINE_FIXED == ("seed",)  # `--seed` is the workload's
    assert [k.name for k in engine_knobs() if not hasattr(args, k.name)] == []
    # the tool's own defaults: 64 sequences, fp32 (CPU benchmarks are fp32); the rest unset
    assert engine_kwargs(args, ENGINE_FIXED) == {"dtype": "float32", "max_num_seqs": 64}


def test_engine_flags_are_spelled_as_serve_spells_them() -> None:
    args = parse_args(["--no-enable-prefix-caching", "--max-num-batched-tokens", "128",
                       "--scheduling-policy", "priority", "--seed", "3", "--max-num-seqs", "8"])
    assert args.seed == 3  # the workload's seed, not the engine's
    assert engine_kwargs(args, ENGINE_FIXED) == {
        "dtype": "float32", "enable_prefix_caching": False, "max_num_seqs": 8,
        "max_num_batched_tokens": 128, "policy": "priority",
    }


def test_a_bad_engine_flag_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--max-num-seqs", "many"])
    assert e.value.code == 2
    assert "argument --max-num-seqs: invalid int value: 'many'" in capsys.readouterr().err

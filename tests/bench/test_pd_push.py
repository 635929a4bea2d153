"""`workbench bench pd-push` on a tiny random checkpoint: both modes measured on the same
prompts, every push round's loads served from pushed KV (a decode read waits for pushes still
on the wire, so this holds on a loaded machine too), the same first tokens, the table, the
JSON and the CPU-share judgement. No figure's speed is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.bench.disagg import push as pd_push
from workbench.bench.disagg.push import FIGURES, PDPushConfig
from workbench.harness.validity import FixedCpuWatch
from workbench.testing import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_checkpoint(tmp_path_factory.mktemp("push") / "llama", arch="llama", seed=0))


def test_both_modes_on_the_same_prompts_every_push_used(
        ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "push.json"
    code = pd_push.main(["--model", ckpt, "--input-len", "40", "--num-prompts", "3",
                         "--repeats", "2", "--block-size", "16", "--json", str(out),
                         "--push-wait-s", "60", "--strict"], watch=FixedCpuWatch(0.6))
    assert code == 2  # others took 60% > 25%: invalid, and --strict says so
    data = json.loads(out.read_text())
    assert data["pushed_loads"] == 2 * 3 and data["first_tokens_equal"] is True
    assert data["valid"] is False and data["other_cpu_share"] == 0.6
    assert set(data["runs"]) == {"pull", "push"}
    assert all(len(data["runs"][m][f]) == 2 and min(data["runs"][m][f]) > 0
               for m in ("pull", "push") for f in FIGURES)
    text = capsys.readouterr().out
    assert "| decode_first_token_s |" in text and "6 of 6 loads served from pushed KV" in text
    assert "INVALID bench pd-push: other processes used 60%" in text


@pytest.mark.parametrize(("kw", "needle"), [
    ({"input_len": 1}, "input_len must be >= 2"),
    ({"num_prompts": 0}, "num_prompts must be an integer >= 1, got 0"),
    ({"max_other_cpu_share": 2.0}, "max_other_cpu_share must be in [0, 1], got 2.0"),
    ({"push_wait_s": 0}, "push_wait_s must be a number > 0, got 0"),
])
def test_config_refuses_bad_values(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        PDPushConfig(**{"model": "m", "input_len": 8, **kw})  # type: ignore[arg-type]
    assert needle in str(e.value)

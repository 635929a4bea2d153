"""`workbench bench spec`: a point measured while other processes took the CPUs is INVALID and
gives no speed-up (the 0.73x n-gram "speed-up" of issue 15 was such a point)."""

from __future__ import annotations

import pytest

from workbench.bench.offline.spec import SpecPoint, run_point, table
from workbench.harness.validity import FixedCpuWatch


def _point(label: str, run_s: float, others: float, valid: bool = True) -> SpecPoint:
    return SpecPoint(label=label, concurrency=4, run_s=[run_s], output_tokens=100,
                     others_cpu=others, valid=valid)


def test_table_gives_no_speedup_from_an_invalid_point() -> None:
    rows = table([_point("off", 1.0, 0.05), _point("ngram k=5", 2.0, 0.6, valid=False),
                  _point("draft k=2", 0.5, float("nan"))]).splitlines()
    assert rows[2] == ("| 4 | off | 100.0 | 1.00x | 1.00x | 0.0% | 1.00 | 0 |  | 5% |")
    assert rows[3] == ("| 4 | ngram k=5 | 50.0 | n/a (invalid) | 1.00x | 0.0% | 1.00 | 0 |  | "
                       "60% INVALID |")
    assert rows[4] == "| 4 | draft k=2 | 200.0 | 2.00x | 1.00x | 0.0% | 1.00 | 0 |  | - |"
    rows = table([_point("off", 1.0, 0.6, valid=False), _point("ngram k=5", 1.0, 0.0)])
    assert rows.splitlines()[3].split(" | ")[3] == "n/a (invalid)"  # its "off" is invalid


def test_run_point_judges_the_worst_timed_run(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.config.named_models import bundled_checkpoint

    model = bundled_checkpoint()
    prompts, max_tokens = [[5, 6, 7, 8]], [3]
    watch = FixedCpuWatch(0.1, 0.4)  # the second of two timed runs is disturbed
    p = run_point(model, prompts, max_tokens, 1, None, 2, "off", {"dtype": "float32"},
                  watch=watch)
    assert watch.calls == 2 and p.others_cpu == 0.4 and not p.valid and len(p.run_s) == 2
    assert ("INVALID point off (concurrency 1): other processes used 40% of the CPUs "
            "(threshold 25%); not used for any result") in capsys.readouterr().out
    p = run_point(model, prompts, max_tokens, 1, None, 1, "off", {"dtype": "float32"},
                  watch=FixedCpuWatch(0.4), max_other_cpu_share=0.5)
    assert p.valid and p.others_cpu == 0.4 and p.to_dict()["valid"] is True

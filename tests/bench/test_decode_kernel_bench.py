"""The decode-kernel micro-benchmark: its inputs are the shapes it names, the kernel and the
torch twin agree on them, and bad flags are refused before any work."""

from __future__ import annotations

import pytest

from workbench.bench.micro import decode_kernel as dk


def test_inputs_and_the_twins_agreement() -> None:
    case = dk.Case("tiny", 3, (5, 40), head_dim=32)
    caches, md, q, k, v, kv_bytes = dk._inputs(case, seed=1)
    assert len(caches) == dk.LAYERS and caches[0].shape[2:] == (16, 4, 32)
    assert q.shape == (3, 8, 32) and k.shape == v.shape == (3, 4, 32)
    assert kv_bytes == 2 * sum(md.seq_lens_cpu) * 4 * 32 * 4
    assert all(5 <= s <= 40 for s in md.seq_lens_cpu) and md.query_lens_cpu == [1, 1, 1]
    # every sequence's new slot lies in its own last block
    for i, s in enumerate(md.seq_lens_cpu):
        assert int(md.slot_mapping[i]) // 16 == int(md.block_tables[i, (s - 1) // 16])
    r = dk.measure(case, runs=1)
    assert r["max_diff"] < 1e-5 and r["kernel"] > 0 and r["twin"] > 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--runs", "0"], "--runs (0) must be >= 1"),
    (["--threads", "0"], "--threads (0) must be >= 1"),
    (["--max-other-cpu-share", "2"], "--max-other-cpu-share (2.0) must be in [0, 1]"),
])
def test_bad_flags_are_refused(flags: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        dk.main(flags)
    assert e.value.code == 2 and message in capsys.readouterr().err

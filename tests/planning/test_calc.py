"""The planning calculator (workbench.planning) and the KV arithmetic it builds on
(workbench.core.kv_cache.utils) against the worked examples of the seeds
(/work/shared/seeds/*.txt)."""

from __future__ import annotations

import math

import pytest

from workbench import planning
from workbench.core.kv_cache.utils import (
    blocks_needed,
    cdiv,
    kv_bytes_per_block,
    kv_bytes_per_token,
    max_concurrency,
    num_blocks_for_budget,
    tp_kv_heads_per_rank,
)
from workbench.metrics.spec_decode import (
    accepted_length_counts,
    accepted_length_distribution,
    mean_acceptance_length,
)
from workbench.planning import (
    GiB,
    decode_step_lower_bound_s,
    forward_passes,
    kv_token_capacity,
    last_block_free_slots,
    memory_budget,
    prefix_cache_hit_tokens,
    spec_acceptance_prob,
    spec_expected_tokens,
    spec_forward_passes,
    spec_predicted_speedup,
    theoretical_concurrency,
    weight_bytes,
)

QWEN3_14B = {"num_layers": 40, "num_kv_heads": 8, "head_dim": 128, "dtype_bytes": 2}


def test_kv_bytes_qwen3_14b_and_fp8_halves_the_block() -> None:
    """Seed 000/001: 2 x layers x kv_heads x head_dim x bytes; an FP8 KV cache halves a block."""
    assert kv_bytes_per_token(**QWEN3_14B) == 163_840  # 160 KiB
    assert kv_bytes_per_block(**QWEN3_14B, block_size=16) == 5 * (1 << 19)  # 2.5 MiB
    fp8 = kv_bytes_per_block(**{**QWEN3_14B, "dtype_bytes": 1}, block_size=16)
    assert 2 * fp8 == kv_bytes_per_block(**QWEN3_14B, block_size=16)


def test_kv_per_token_70b_is_smaller_than_a_40_head_model() -> None:
    """Seed 000: 70B (80 layers, 8 KV heads) vs 40 layers x 40 KV heads, head_dim 128 both:
    twice the layers but a fifth of the KV heads, so 2.5x smaller, not 2x or 5.3x larger."""
    big = kv_bytes_per_token(80, 8, 128, 2)
    mha = kv_bytes_per_token(40, 40, 128, 2)
    assert mha / big == 2.5


def test_blocks_fill_left_to_right_221_tokens() -> None:
    """Seed 000: 221 tokens at block 16 use 14 blocks with 3 empty slots (13 is the filled
    count); prompt and output share the block table, not 12 + 3 = 15 blocks with 7 empty."""
    assert blocks_needed(221, 16) == 14
    assert last_block_free_slots(221, 16) == 3
    assert 221 % 16 == 13
    assert blocks_needed(180, 16) + blocks_needed(41, 16) == 15  # the wrong answer's split
    assert last_block_free_slots(41, 16) == 7
    assert blocks_needed(100, 16) == 7 and blocks_needed(96, 16) == 6  # CoW question
    assert last_block_free_slots(96, 16) == 0 and blocks_needed(0, 16) == 0


def test_prefix_hit_full_blocks_only_1530_to_1520() -> None:
    """Seed 000: a 1,530-token system prompt at block 16 hits 1,520 (the last 10 tokens do not
    fill a block); with a 60-token question 70 tokens are recomputed, not 60/76/1,590.
    Same quiz: 2,010 shared tokens at page 16 stop at 2,000, not 1,984."""
    assert prefix_cache_hit_tokens(1530, 16) == 1520
    assert 1530 + 60 - prefix_cache_hit_tokens(1530, 16, prompt_tokens=1590) == 70
    assert prefix_cache_hit_tokens(2010, 16) == 2000
    assert prefix_cache_hit_tokens(2010, 1) == 2010


def test_prefix_hit_caps_at_prompt_minus_one() -> None:
    """vLLM (seed 000 semantics): a whole-prompt hit is capped at num_tokens - 1 (the last
    token is recomputed for its logits), then rounded down to full blocks."""
    assert prefix_cache_hit_tokens(1536, 16) == 1536
    assert prefix_cache_hit_tokens(1536, 16, prompt_tokens=1536) == 1520
    assert prefix_cache_hit_tokens(1536, 16, prompt_tokens=1537) == 1536
    assert prefix_cache_hit_tokens(16, 16, prompt_tokens=16) == 0
    with pytest.raises(ValueError, match=r"shared_prefix_tokens \(20\).*prompt_tokens \(10\)"):
        prefix_cache_hit_tokens(20, 16, prompt_tokens=10)


def test_max_concurrency_8x_and_max_model_len_in_the_denominator() -> None:
    """Seed 000: a 262,144-token pool over max_model_len 32,768 is the logged 8.00x; halving
    max_model_len doubles the concurrency (6.50x -> 13.00x, not 3.25x) and concurrency x
    max_model_len (the pool in tokens) stays the same."""
    blocks = 262_144 // 16
    assert kv_token_capacity(blocks, 16) == 262_144
    assert max_concurrency(blocks, 16, 32_768) == 8.0
    assert max_concurrency(blocks, 16, 16_384) == 16.0
    six_and_a_half = 6.5 * 2048
    assert max_concurrency(int(six_and_a_half), 16, 32_768) == 6.5
    assert max_concurrency(int(six_and_a_half), 16, 16_384) == 13.0
    assert max_concurrency(blocks, 16, 16_384) * 16_384 == max_concurrency(
        blocks, 16, 32_768
    ) * 32_768


def test_theoretical_concurrency_35() -> None:
    """Seed 001: floor(72,064 / 2,048) = 35, an arithmetic upper bound."""
    assert theoretical_concurrency(72_064, 2_048) == 35


def test_weight_bytes_14b() -> None:
    """Seed 001: 14B x 2 bytes ~ 28 GB in BF16, x 0.5 byte ~ 7 GB at 4 bit (ideal)."""
    assert weight_bytes(14_000_000_000, 2) == 28_000_000_000
    assert weight_bytes(14_000_000_000, 0.5) == 7_000_000_000
    assert weight_bytes(3, 0.5) == 2  # packed nibbles round up


def test_seed001_logged_capacity_matches_logged_kv_gib() -> None:
    """Seed 001 table: KV 11.00 GiB <-> 72,064 tokens, 29.15 GiB <-> 191,056 (2.651x).

    vLLM logs "Available KV cache memory" to 2 decimals and the capacity as blocks x 16; at
    2.5 MiB a block, 72,064 tokens are 4,504 blocks = 10.996 GiB and 191,056 are 11,941 blocks =
    29.153 GiB: both round to the logged figures (block size 16; 32 would not divide 191,056).
    """
    per_token = kv_bytes_per_token(**QWEN3_14B)
    assert 72_064 % 16 == 0 and 191_056 % 16 == 0 and 191_056 % 32 != 0
    assert f"{72_064 * per_token / GiB:.2f}" == "11.00"
    assert f"{191_056 * per_token / GiB:.2f}" == "29.15"
    assert f"{191_056 / 72_064:.3f}" == "2.651"


def test_memory_budget_qwen3_14b_awq_moves_weights_into_kv() -> None:
    """Seed 001, Qwen3-14B on one budget: weights 27.5185 -> 9.3619 GiB (AWQ), KV 11.00 ->
    29.15 GiB, capacity 72,064 -> 191,056 tokens, weights + KV ~38.5 GiB in both.

    The seed's KV GiB are the log's 2-decimal roundings, so its weights + KV (38.5185 vs
    38.5119) are not exact. Every budget for weights + KV in [38.5148, 38.5170] GiB reproduces
    both capacities exactly with the same activations/graph/headroom; 38.516 is one of them.
    """
    per_token = kv_bytes_per_token(**QWEN3_14B)
    budget = round(38.516 * GiB)
    base = memory_budget(budget, round(27.5185 * GiB), per_token, 16, max_model_len=40_960)
    awq = memory_budget(budget, round(9.3619 * GiB), per_token, 16, max_model_len=40_960)
    assert (base["kv_num_blocks"], base["kv_token_capacity"]) == (4_504, 72_064)
    assert (awq["kv_num_blocks"], awq["kv_token_capacity"]) == (11_941, 191_056)
    assert f"{base['kv_cache_gib']:.2f}" == "11.00" and f"{awq['kv_cache_gib']:.2f}" == "29.15"
    assert base["weight_plus_kv_gib"] == pytest.approx(38.5, abs=0.02)
    assert awq["weight_plus_kv_gib"] == pytest.approx(base["weight_plus_kv_gib"])
    assert f"{1 - awq['weight_gib'] / base['weight_gib']:.4f}" == "0.6598"  # 65.98% smaller
    assert base["max_concurrency"] == pytest.approx(4_504 / 2_560)
    for lo_hi in (38.5148, 38.5170):  # the interval's ends still reproduce both
        b = round(lo_hi * GiB)
        assert memory_budget(b, round(27.5185 * GiB), per_token, 16)["kv_token_capacity"] == 72_064
        assert memory_budget(b, round(9.3619 * GiB), per_token, 16)["kv_token_capacity"] == 191_056


def test_memory_budget_reserves_come_out_of_kv() -> None:
    """Seed 001: available = weights + KV + activations + graph reserve + headroom."""
    r = memory_budget(
        40 * GiB, 20 * GiB, 1 << 17, 16,
        activation_bytes=2 * GiB, graph_reserve_bytes=GiB, headroom_bytes=GiB,
    )
    assert r["kv_cache_bytes"] == 16 * GiB and r["kv_num_blocks"] == 8192
    assert r["max_concurrency"] is None
    with pytest.raises(ValueError, match="leave no KV cache"):
        memory_budget(20 * GiB, 20 * GiB, 1 << 17, 16)


def test_forward_passes_prefill_emits_the_first_token() -> None:
    """Seed 000: 2,048-token prompt + 300 outputs = 300 passes (not 301, not 2,348); a
    12,000-token prompt under a 4,096 budget is chunked (3 passes), never starved."""
    assert forward_passes(2048, 300, 8192) == 300
    assert forward_passes(12_000, 100, 4096) == 3 + 99
    assert forward_passes(1, 1, 1) == 1


def test_decode_step_lower_bound_is_bytes_over_bandwidth() -> None:
    """Seed 000: an 8B bf16 model on ~2 TB/s: ~8 ms (fp32 would be the wrong ~16 ms, 8 GB the
    wrong ~4 ms). TP=4 of 65.6 GB at 2,039 GB/s a card: 124 tok/s counted per card or in
    total (31 and 497 are the wrong mixes). A 32x longer context: 16 GiB weights + KV
    0.49 -> 15.63 GiB is only ~1.9x slower."""
    assert decode_step_lower_bound_s(16e9, 0, 2e12) == pytest.approx(8e-3)
    assert decode_step_lower_bound_s(32e9, 0, 2e12) == pytest.approx(16e-3)
    assert decode_step_lower_bound_s(8e9, 0, 2e12) == pytest.approx(4e-3)
    total = 1 / decode_step_lower_bound_s(65.6e9, 0, 4 * 2039e9)
    per_card = 1 / decode_step_lower_bound_s(65.6e9 / 4, 0, 2039e9)
    assert round(total) == round(per_card) == 124
    assert round(1 / decode_step_lower_bound_s(65.6e9, 0, 2039e9)) == 31
    ratio = decode_step_lower_bound_s(16 * GiB, 15.63 * GiB, 1e12) / decode_step_lower_bound_s(
        16 * GiB, 0.49 * GiB, 1e12
    )
    assert round(ratio, 1) == 1.9


def test_tp_shards_then_replicates_kv_heads() -> None:
    """Seed 000: TP shards KV heads; past kv_heads each rank keeps 1 (replicated), so a 4-KV-head
    model at TP 8 starts (no divisibility error) and per-token KV stops shrinking."""
    assert tp_kv_heads_per_rank(8, 1) == 8
    assert tp_kv_heads_per_rank(8, 4) == 2
    assert tp_kv_heads_per_rank(8, 8) == 1
    assert tp_kv_heads_per_rank(8, 16) == 1
    assert tp_kv_heads_per_rank(4, 8) == 1
    with pytest.raises(ValueError, match=r"num_kv_heads \(8\) and tp_size \(3\)"):
        tp_kv_heads_per_rank(8, 3)
    with pytest.raises(ValueError, match=r"num_kv_heads \(4\) and tp_size \(6\)"):
        tp_kv_heads_per_rank(4, 6)


def test_spec_acceptance_is_min_one_p_over_q() -> None:
    """Seed 000: p = 0.2, q = 0.5 -> 40% (not 100%, 20% or 60%); p >= q always passes."""
    assert spec_acceptance_prob(0.2, 0.5) == pytest.approx(0.4)
    assert spec_acceptance_prob(0.5, 0.2) == 1.0
    assert 0.5 * spec_acceptance_prob(0.2, 0.5) == pytest.approx(0.2)  # final frequency = p


def test_spec_expected_tokens() -> None:
    """Seed 000: a = 0.5, k = 3 -> 1.875 (not 1.5, 2 or 2.5); the k -> inf ceiling is 2."""
    assert spec_expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert 1 + 0.5 + 0.25 + 0.125 == spec_expected_tokens(0.5, 3)
    assert spec_expected_tokens(0.5, 200) == pytest.approx(2.0)
    assert spec_expected_tokens(1.0, 5) == 6.0
    assert spec_expected_tokens(0.0, 5) == 1.0
    assert spec_expected_tokens(0.85, 5) == pytest.approx(4.1523, abs=1e-4)


def test_accepted_length_distribution_seed002() -> None:
    """Seed 002 section 5-2: 80 drafts, per-position counters 70 70 70 70 60 -> 10 drafts
    accepted 0, none 1-3, 10 accepted 4, 60 accepted all 5 (sums back to 340 accepted)."""
    counts = accepted_length_counts(80, [70, 70, 70, 70, 60])
    assert counts == [10, 0, 0, 0, 10, 60]
    assert sum(i * n for i, n in enumerate(counts)) == 340
    dist = accepted_length_distribution(80, [70, 70, 70, 70, 60])
    assert dist == [0.125, 0.0, 0.0, 0.0, 0.125, 0.75]
    assert math.fsum(dist) == 1.0
    with pytest.raises(ValueError, match="non-increasing"):
        accepted_length_distribution(80, [60, 70])
    with pytest.raises(ValueError, match=r"num_drafts \(10\)"):
        accepted_length_distribution(10, [20])


def test_mean_acceptance_length_seed002() -> None:
    """Seed 002: 340 of 400 draft tokens accepted (85%), 4.25 per draft -> 5.25 per step; an
    i.i.d. model at 85% would predict only 4.15 (the distribution is bimodal)."""
    assert 340 / 400 == 0.85 and 340 / 80 == 4.25
    assert mean_acceptance_length(80, 340) == 5.25
    assert mean_acceptance_length(80, 340) > spec_expected_tokens(0.85, 5)


def test_spec_forward_passes_seed002_68_tokens_to_34() -> None:
    """Seed 002 section 5-3: 68 tokens, 8 drafts x 5, 34 accepted per request: draft steps make
    34 + 8 = 42 tokens, 26 plain steps, 8 + 26 = 34 forwards vs 68 -> 2.00x predicted (1.91x
    measured). The run's totals (680 tokens, 80 drafts, 340 accepted) give the same 2.0x."""
    assert spec_forward_passes(68, 8, 34) == 8 + (68 - (34 + 8)) == 34
    assert spec_predicted_speedup(68, 8, 34) == 2.0
    assert spec_predicted_speedup(680, 80, 340) == 2.0
    assert spec_forward_passes(10, 0, 0) == 10
    with pytest.raises(ValueError, match=r"accepted_tokens \(60\) \+ num_drafts \(10\)"):
        spec_forward_passes(68, 10, 60)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: blocks_needed(10, 0), "block_size must be an integer >= 1, got 0"),
        (lambda: blocks_needed(-1, 16), "num_tokens must be an integer >= 0, got -1"),
        (lambda: kv_bytes_per_token(0, 8, 128, 2), "num_layers must be an integer >= 1, got 0"),
        (lambda: prefix_cache_hit_tokens(-5, 16), "shared_prefix_tokens must be an integer"),
        (lambda: forward_passes(100, 0, 4096), "output_tokens must be an integer >= 1, got 0"),
        (lambda: forward_passes(100, 10, 0), "max_num_batched_tokens must be"),
        (lambda: max_concurrency(10, 16, 0), "max_model_len must be an integer >= 1, got 0"),
        (lambda: spec_acceptance_prob(0.2, 0.0), "q_draft must be > 0"),
        (lambda: spec_acceptance_prob(1.2, 0.5), "p_target must be a number in [0.0, 1.0]"),
        (lambda: spec_expected_tokens(-0.1, 5), "acceptance_rate must be a number in"),
        (lambda: spec_expected_tokens(0.5, -1), "num_spec_tokens must be an integer >= 0"),
        (lambda: mean_acceptance_length(0, 0), "num_drafts must be an integer >= 1, got 0"),
        (lambda: decode_step_lower_bound_s(1e9, 0, 0), "bandwidth_bytes_per_s must be > 0"),
        (lambda: weight_bytes(-1, 2), "num_params must be an integer >= 0, got -1"),
        (lambda: tp_kv_heads_per_rank(8, 0), "tp_size must be an integer >= 1, got 0"),
        (lambda: kv_token_capacity(1, 16.0), "block_size must be an integer >= 1, got 16.0"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(call, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert needle in str(err.value)


def test_engine_helpers_keep_their_behaviour() -> None:
    """The engine imports cdiv, num_blocks_for_budget, max_concurrency and kv_bytes_per_block."""
    assert cdiv(17, 16) == 2 and cdiv(16, 16) == 1 and cdiv(0, 16) == 0
    assert num_blocks_for_budget(11 * GiB, 2_621_440) == 4505
    assert max_concurrency(4504, 16, 40_960) == pytest.approx(1.759375)


# ------------------------------------------------------------------ `workbench calc` CLI
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    from workbench.planning.cli import main

    main(list(argv))
    out = capsys.readouterr().out
    return dict(line.rsplit("  ", 1) for line in out.splitlines())  # type: ignore[misc]


def _row(rows: dict[str, str], key: str) -> str:
    return next(v.strip() for k, v in rows.items() if k.strip() == key)


def test_cli_kv_qwen3_14b(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 001 shape; an exact 11 GiB budget holds 4,505 blocks (the log's 11.00 GiB was a
    rounded 10.996 GiB: 4,504 blocks, see the memory_budget test)."""
    rows = _cli(capsys, "kv", "--layers", "40", "--kv-heads", "8", "--head-dim", "128",
                "--dtype-bytes", "2", "--block-size", "16", "--budget-gib", "11",
                "--max-model-len", "40960")
    assert _row(rows, "kv bytes/token") == "163,840"
    assert _row(rows, "kv bytes/block") == "2,621,440"
    assert _row(rows, "blocks") == "4,505"
    assert _row(rows, "token capacity") == "72,080"
    assert _row(rows, "max concurrency @ 40,960") == "1.76x"


def test_cli_budget_reproduces_seed001(capsys: pytest.CaptureFixture[str]) -> None:
    shape = ("--layers", "40", "--kv-heads", "8", "--head-dim", "128", "--available-gib",
             "38.516")
    rows = _cli(capsys, "budget", *shape, "--weights-gib", "27.5185")
    assert _row(rows, "kv token capacity") == "72,064"
    rows = _cli(capsys, "budget", *shape, "--weights-gib", "9.3619")
    assert _row(rows, "kv token capacity") == "191,056"
    assert _row(rows, "kv cache GiB").startswith("29.15")


def test_cli_blocks_prefix_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 000 examples: 221 tokens, the 1,530-token system prompt, chunked 12,000 tokens."""
    rows = _cli(capsys, "blocks", "--tokens", "221")
    assert (_row(rows, "blocks"), _row(rows, "last block free slots")) == ("14", "3")
    rows = _cli(capsys, "prefix", "--shared", "1530", "--prompt", "1590")
    assert (_row(rows, "prefix hit tokens"), _row(rows, "tokens to prefill")) == ("1,520", "70")
    rows = _cli(capsys, "passes", "--prompt", "12000", "--output", "100", "--budget", "4096")
    assert _row(rows, "prefill chunks") == "3"
    assert _row(rows, "decode passes") == "99"
    assert _row(rows, "forward passes") == "102"


def test_cli_decode_tp4_124_tokens_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 000: 65.6 GB over 4 x 2,039 GB/s -> ~124 tok/s."""
    rows = _cli(capsys, "decode", "--weights", "65.6GB", "--bandwidth", "8156GB")
    assert _row(rows, "tokens/s per request upper bound").startswith("124.3")


def test_cli_spec_and_counters(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 000 (p 0.2 / q 0.5) and seed 002 (80 drafts, 340 accepted, 680 tokens -> 2.00x)."""
    rows = _cli(capsys, "spec", "--acceptance", "0.85", "--k", "5", "--p", "0.2", "--q", "0.5")
    assert _row(rows, "expected tokens/verification") == "4.1523"
    assert _row(rows, "acceptance prob min(1, p/q)") == "0.4"
    rows = _cli(capsys, "spec-counters", "--drafts", "80", "--accepted", "340",
                "--per-position", "70", "70", "70", "70", "60", "--output-tokens", "680")
    assert _row(rows, "acceptance rate") == "0.85"
    assert _row(rows, "mean acceptance length") == "5.25"
    assert _row(rows, "P(accepted = 5)") == "0.7500 (60 drafts)"
    assert _row(rows, "predicted speed-up") == "2.00x"
    assert "warning" not in rows


def test_cli_tp_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _cli(capsys, "tp", "--kv-heads", "8", "--tp", "16")
    assert (_row(rows, "kv heads per rank"), _row(rows, "layout")) == ("1", "replicated x2")
    rows = _cli(capsys, "tp", "--kv-heads", "8", "--tp", "4")
    assert (_row(rows, "kv heads per rank"), _row(rows, "layout")) == ("2", "sharded")
    from workbench.planning.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tp", "--kv-heads", "8", "--tp", "3"])
    assert exit_.value.code == 2
    assert "num_kv_heads (8) and tp_size (3)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["decode", "--weights", "16 parsecs", "--bandwidth", "2TB"])


def test_parse_bytes_units() -> None:
    from workbench.planning.commands import parse_bytes

    assert parse_bytes("16GB") == 16e9
    assert parse_bytes("2 GiB") == 2 * GiB
    assert parse_bytes("1024") == 1024
    assert parse_bytes("0.5kib") == 512


# ------------------------------------------------------------------ KV transfer vs recompute
# Seed 003 (PD disaggregation): 80 layers, 8 KV heads, head_dim 128, FP16 -> about 320 KB a
# token; an 8K prompt about 2.6 GB; a 400 Gb/s link (about 50 GB/s) moves it in a little over
# 50 ms, which pays against a prefill of hundreds of ms; on short prompts the overhead wins.
# The seed names no model size or GPU: the recompute side assumes its shape is Llama-70B's
# (64 query heads, 70e9 weights) prefilled on 8 x H100 SXM (989 TFLOP/s dense) at 50% MFU.
SEED003 = dict(num_layers=80, num_kv_heads=8, num_heads=64, head_dim=128, dtype_bytes=2,
               num_params=70e9, bandwidth_bytes_per_s=50e9, peak_flops=8 * 989e12)


def test_kv_transfer_seed003_8k_prompt_over_400g() -> None:
    r = planning.kv_transfer_break_even(prompt_tokens=8192, **SEED003)
    assert r["kv_bytes_per_token"] == 327_680 == 320 * 1024  # "about 320 KB"
    assert r["kv_bytes"] == 2_684_354_560 == 2.5 * GiB  # 8,192 tokens: 2.68 GB
    assert planning.kv_transfer_break_even(prompt_tokens=8000, **SEED003)["kv_bytes"] == 2.62144e9
    assert r["transfer_s"] == pytest.approx(0.05369, abs=1e-5)  # "a little over 50 ms"
    assert planning.link_bandwidth("400gbe") == 50e9  # 400 Gb/s / 8: the seed's "about 50 GB/s"
    assert r["linear_flops"] == 2 * 70e9 * 8192
    assert r["attention_flops"] == 4 * 80 * 64 * 128 * 8192 * 8193 / 2
    assert r["recompute_s"] == pytest.approx(0.3121, abs=1e-4)  # "hundreds of ms"
    assert r["winner"] == "transfer" and r["speedup"] == pytest.approx(5.814, abs=1e-3)
    assert r["break_even_bandwidth_bytes_per_s"] == pytest.approx(8.5997e9, rel=1e-4)
    assert r["break_even_tokens"] == 0  # no fixed cost: the transfer wins at any length
    # "on short prompts the transfer overhead eats the gain": 1 ms per transfer
    short = planning.kv_transfer_break_even(prompt_tokens=16, latency_s=1e-3, **SEED003)
    assert short["winner"] == "recompute" and short["recompute_s"] < short["transfer_s"]
    assert short["break_even_tokens"] == pytest.approx(34.665, abs=1e-3)
    assert short["break_even_bandwidth_bytes_per_s"] == math.inf  # latency alone loses
    assert planning.kv_transfer_break_even(prompt_tokens=34, latency_s=1e-3,
                                       **SEED003)["winner"] == "recompute"
    assert planning.kv_transfer_break_even(prompt_tokens=35, latency_s=1e-3,
                                       **SEED003)["winner"] == "transfer"


def test_kv_transfer_break_even_is_where_the_times_meet() -> None:
    assert planning.prefill_flops(1000, 3, 2, 2, 4) == {"linear": 6000.0, "attention": 384.0,
                                                   "total": 6384.0}
    shape = {**SEED003, "num_params": 8e9, "num_layers": 32, "num_heads": 32}
    r = planning.kv_transfer_break_even(prompt_tokens=4096, **shape)
    at = planning.kv_transfer_break_even(
        prompt_tokens=4096, **{**shape, "bandwidth_bytes_per_s":
                               r["break_even_bandwidth_bytes_per_s"]})
    assert at["transfer_s"] == pytest.approx(at["recompute_s"], rel=1e-12)
    slow = planning.kv_transfer_break_even(prompt_tokens=4096, **{**shape,
                                                             "bandwidth_bytes_per_s": 1e9})
    assert slow["winner"] == "recompute" and slow["break_even_tokens"] > 4096
    n = slow["break_even_tokens"]
    for tokens, winner in ((math.floor(n), "recompute"), (math.ceil(n), "transfer")):
        got = planning.kv_transfer_break_even(prompt_tokens=tokens, **{
            **shape, "bandwidth_bytes_per_s": 1e9})
        assert got["winner"] == winner
    assert planning.kv_transfer_time_s(1e9, 31.5e9, 2e-3) == pytest.approx(1 / 31.5 + 2e-3)


def test_link_and_gpu_presets() -> None:
    assert planning.link_bandwidth("pcie4-x16") == pytest.approx(31.5077e9, rel=1e-5)
    assert planning.link_bandwidth("pcie5-x16") == pytest.approx(63.0154e9, rel=1e-5)
    assert planning.link_bandwidth("nvlink-h100") == planning.link_bandwidth("nvlink-h200") == 450e9
    assert planning.link_bandwidth("100gbe") == 12.5e9
    assert planning.link_bandwidth("host-dram") == 8 * 38.4e9 / 2
    assert planning.gpu_peak_flops("h100-sxm") == planning.gpu_peak_flops("h200") == 989e12
    assert planning.gpu_peak_flops("a100") == 312e12


@pytest.mark.parametrize(("kw", "needle"), [
    ({"prompt_tokens": 0}, "prompt_tokens must be an integer >= 1, got 0"),
    ({"num_heads": 60}, "num_heads (60) must be a multiple of num_kv_heads (8)"),
    ({"bandwidth_bytes_per_s": 0}, "bandwidth_bytes_per_s must be a finite number > 0, got 0"),
    ({"peak_flops": -1.0}, "peak_flops must be a number >= 0.0, got -1.0"),
    ({"efficiency": 0}, "efficiency must be a number in (0, 1]"),
    ({"efficiency": 1.5}, "efficiency must be a number in (0, 1] (the share of the peak "
                          "FLOP/s a prefill sustains), got 1.5"),
    ({"latency_s": -1e-3}, "latency_s must be a number >= 0.0, got -0.001"),
    ({"num_params": 0}, "num_params must be a finite number > 0, got 0"),
    ({"num_kv_heads": 0}, "num_kv_heads must be an integer >= 1, got 0"),
])
def test_kv_transfer_bad_arguments(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as err:
        planning.kv_transfer_break_even(**{**SEED003, "prompt_tokens": 8192, **kw})
    assert needle in str(err.value)
    with pytest.raises(ValueError, match=r"link \('pcie6'\) must be one of \['100gbe', "):
        planning.link_bandwidth("pcie6")
    with pytest.raises(ValueError, match=r"gpu \('b200'\) must be one of \['a100', "):
        planning.gpu_peak_flops("b200")


SEED003_CLI = ("transfer", "--layers", "80", "--kv-heads", "8", "--heads", "64",
               "--head-dim", "128", "--params", "70e9")


def test_cli_transfer_seed003(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _cli(capsys, *SEED003_CLI, "--prompt", "8192", "--link", "400gbe", "--gpu",
                "h100-sxm", "--gpus", "8")
    assert _row(rows, "kv bytes/token") == "327,680"
    assert _row(rows, "kv GB") == "2.6844"
    assert _row(rows, "transfer ms") == "53.6871"
    assert _row(rows, "prefill TFLOPs (linear + attention)") == "1,234.9 (1,146.9 + 88.0)"
    assert _row(rows, "recompute ms") == "312.1465"
    assert _row(rows, "faster") == "transfer (5.81x)"
    assert _row(rows, "break-even link GB/s") == "8.60"
    assert _row(rows, "transfer wins above tokens") == "any length"
    rows = _cli(capsys, *SEED003_CLI, "--prompt", "16", "--bandwidth", "50GB", "--latency-ms",
                "1", "--peak-tflops", "989", "--gpus", "8")
    assert _row(rows, "faster") == "recompute (1.95x)"
    assert _row(rows, "break-even link GB/s") == "never (latency >= recompute)"
    assert _row(rows, "transfer wins above tokens") == "34.7"
    rows = _cli(capsys, *SEED003_CLI, "--prompt", "8192", "--link", "pcie4-x16", "--links",
                "8", "--gpu", "h100-sxm", "--gpus", "8")
    assert _row(rows, "link GB/s") == "252.0615"


@pytest.mark.parametrize(("extra", "needle"), [
    (("--link", "400gbe", "--bandwidth", "50GB", "--gpu", "h200"), "give --link (one of"),
    (("--gpu", "h200"), "give --link (one of"),
    (("--link", "400gbe"), "give --gpu (one of ['a100', 'h100-sxm', 'h200']) or --peak-tflops"),
    (("--link", "pcie6", "--gpu", "h200"), "link ('pcie6') must be one of"),
    (("--link", "400gbe", "--gpu", "h200", "--gpus", "0"), "--gpus must be an integer >= 1"),
    (("--link", "400gbe", "--gpu", "h200", "--efficiency", "2"), "efficiency must be a number"),
])
def test_cli_transfer_bad_input(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...],
                                needle: str) -> None:
    from workbench.planning.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*SEED003_CLI, "--prompt", "8192", *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench calc transfer: ") and needle in err


# ------------------------------------------------------------------ P:D disaggregation
def test_pd_ratio_balances_the_pools() -> None:
    """1,024-token prompts at 8,192 tok/s: 8 req/s per prefill instance; 257 outputs (256
    decoded) at 1,024 tok/s: 4 req/s per decode instance; balance at P:M = 4 / 8 = 0.5."""
    r = planning.pd_ratio(4, 1024, 257, 8192, 1024, request_rate=3)
    assert [(s.label, s.prefill_rate, s.decode_rate, s.system_rate, s.bottleneck)
            for s in r.splits] == [("1:3", 8.0, 12.0, 8.0, "prefill"),
                                   ("2:2", 16.0, 8.0, 8.0, "decode"),
                                   ("3:1", 24.0, 4.0, 4.0, "decode")]
    assert r.best.label == "1:3"  # tied with 2:2 at 8 req/s: the more balanced one
    assert r.balanced_ratio == 0.5
    assert r.prefill_rate_per_instance == 8.0 and r.decode_rate_per_instance == 4.0
    assert r.ideal_rate == pytest.approx(4 * 8 * 4 / 12)
    # colocated: 4 / (1024 / 8192 + 256 / 1024) = 4 / 0.375, the ideal fractional split
    assert r.colocated_rate == pytest.approx(32 / 3) == pytest.approx(r.ideal_rate)
    assert (r.min_prefill_instances, r.min_decode_instances) == (1, 1)
    assert r.decode_batch is None and r.transfer_s is None and r.decode_tok_s == 1024.0
    assert [row["meets_rate"] for row in r.rows()] == [True, True, True]
    assert [row["best"] for row in r.rows()] == [True, False, False]
    assert list(r.rows()[0]) == ["split", "prefill_instances", "decode_instances",
                                 "prefill_rate", "decode_rate", "system_rate", "bottleneck",
                                 "best", "meets_rate"]


def test_pd_ratio_exact_balance_and_rate_requirements() -> None:
    r = planning.pd_ratio(3, 1000, 101, 10_000, 500, request_rate=12)
    # p = 10 req/s, d = 5 req/s: 1:2 gives 10 and 10
    assert r.best.label == "1:2" and r.best.bottleneck == "balanced"
    assert r.best.system_rate == 10.0 and r.balanced_ratio == 0.5
    assert (r.min_prefill_instances, r.min_decode_instances) == (2, 3)
    assert [row["meets_rate"] for row in r.rows()] == [False, False]
    lines = r.table().splitlines()
    assert lines[:4] == [
        "| P:M | prefill req/s | decode req/s | system req/s | bottleneck | meets 12 req/s |",
        "|---|---:|---:|---:|---|---|",
        "| 1:2 * | 10.000 | 10.000 | 10.000 | balanced | no |",
        "| 2:1 | 20.000 | 5.000 | 5.000 | decode | no |"]
    assert "for 12 req/s: at least 2 prefill + 3 decode instances" in lines


def test_pd_ratio_decode_curve_takes_its_best_point() -> None:
    r = planning.pd_ratio(4, 512, 65, 4096, {1: 100.0, 8: 640.0, 32: 512.0})
    assert (r.decode_tok_s, r.decode_batch) == (640.0, 8)
    assert r.decode_rate_per_instance == 10.0 and r.balanced_ratio == 1.25
    assert "decode 65 - 1 tokens at 640 tok/s at batch 8" in r.table()


def test_pd_ratio_link_bounds_the_prefill_instances() -> None:
    """8,192 tokens x 327,680 bytes over 50 GB/s: 53.687 ms, 18.63 req/s per prefill
    instance, below the 100 req/s its compute allows."""
    r = planning.pd_ratio(4, 8192, 101, 819_200, 2000, kv_bytes_per_token=327_680,
                      link_bandwidth_bytes_per_s=50e9)
    assert r.transfer_s == pytest.approx(8192 * 327_680 / 50e9)
    assert r.prefill_rate_per_instance == pytest.approx(50e9 / (8192 * 327_680))
    s = r.splits[0]
    assert (s.prefill_rate, s.link_rate, s.bottleneck) == (100.0, pytest.approx(18.6264515),
                                                           "link")
    assert r.best.label == "2:2" and r.best.system_rate == pytest.approx(2 * 18.6264515)
    assert "link_rate" in r.rows()[0]
    assert r.table().splitlines()[0] == ("| P:M | prefill req/s | decode req/s | link req/s | "
                                         "system req/s | bottleneck |")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"num_workers": 1}, "num_workers must be an integer >= 2, got 1"),
    ({"input_tokens": 0}, "input_tokens must be a finite number > 0, got 0"),
    ({"output_tokens": 1}, "output_tokens must be a number >= 2.0, got 1"),
    ({"prefill_tok_s": -5}, "prefill_tok_s must be a number >= 0.0, got -5"),
    ({"decode_tok_s": {}}, "decode_tok_s must be a number or a non-empty"),
    ({"decode_tok_s": {0: 5.0}}, "decode_tok_s batch must be an integer >= 1, got 0"),
    ({"request_rate": 0}, "request_rate must be a finite number > 0, got 0"),
    ({"kv_bytes_per_token": 10}, "kv_bytes_per_token and link_bandwidth_bytes_per_s go"),
])
def test_pd_ratio_bad_arguments(kw: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"num_workers": 4, "input_tokens": 1024, "output_tokens": 257,
                               "prefill_tok_s": 8192, "decode_tok_s": 1024, **kw}
    with pytest.raises(ValueError) as exc:
        planning.pd_ratio(**args)  # type: ignore[arg-type]
    assert needle in str(exc.value)


PD_CLI = ("pd", "--workers", "4", "--input-len", "1024", "--output-len", "257",
          "--prefill-tok-s", "8192")


def test_cli_pd_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.planning.cli import main

    main([*PD_CLI, "--decode-tok-s", "1:120", "8:700", "32:1024", "--rate", "3",
          "--kv-bytes-per-token", "320KB", "--link", "400gbe"])
    assert capsys.readouterr().out.splitlines() == [
        "| P:M | prefill req/s | decode req/s | link req/s | system req/s | bottleneck | "
        "meets 3 req/s |",
        "|---|---:|---:|---:|---:|---|---|",
        "| 1:3 * | 8.000 | 12.000 | 152.588 | 8.000 | prefill | yes |",
        "| 2:2 | 16.000 | 8.000 | 305.176 | 8.000 | decode | yes |",
        "| 3:1 | 24.000 | 4.000 | 457.764 | 4.000 | decode | yes |",
        "",
        "best split 1:3: 8.000 req/s (prefill)",
        "balancing ratio P:M = 0.500 (prefill 1024 tokens at 8192 tok/s; decode 257 - 1 "
        "tokens at 1024 tok/s at batch 32)",
        "ideal fractional split: 10.667 req/s; colocated (4 instances doing both): "
        "10.667 req/s",
        "KV transfer per request: 6.554 ms (adds to TTFT; bounds a prefill instance at "
        "1 / transfer req/s)",
        "for 3 req/s: at least 1 prefill + 1 decode instances"]


@pytest.mark.parametrize(("extra", "needle"), [
    (("--decode-tok-s", "1024", "--workers", "1"), "--workers must be an integer >= 2, got 1"),
    (("--decode-tok-s", "8:x"), "--decode-tok-s '8:x' must be a number, got 'x'"),
    (("--decode-tok-s", "fast"), "--decode-tok-s must be a number, got 'fast'"),
    (("--decode-tok-s", "0:5"), "--decode-tok-s '0:5' must be BATCH:TOK_S"),
    (("--decode-tok-s", "1024", "--output-len", "1"), "--output-len must be a number >= 2.0"),
    (("--decode-tok-s", "1024", "--kv-bytes-per-token", "1KB"),
     "--kv-bytes-per-token needs --link (one of"),
    (("--decode-tok-s", "1024", "--link", "400gbe"), "--link / --bandwidth need "
     "--kv-bytes-per-token"),
    (("--decode-tok-s", "1024", "--kv-bytes-per-token", "1KB", "--link", "x"),
     "link ('x') must be one of"),
])
def test_cli_pd_bad_input_is_one_line(capsys: pytest.CaptureFixture[str],
                                      extra: tuple[str, ...], needle: str) -> None:
    from workbench.planning.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*PD_CLI, *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench calc pd: ") and needle in err
    assert len(err.strip().splitlines()) == 1

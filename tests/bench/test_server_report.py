"""`workbench bench`'s server-side table: the console leaves out counters that did not move."""

from __future__ import annotations

from workbench.bench.cli import server_report

SIDE = {
    "delta": {
        "vllm:time_to_first_token_seconds:mean_delta": 0.00623,
        "vllm:generation_tokens_total": 371.0,
        "vllm:num_preemptions_total": 0.0,
        "workbench:kv_transfer_send_bytes_total": 0.0,
        'vllm:request_success_total{finished_reason="length"}': 8.0,
    },
    "series": [{"running": 3, "waiting": 1}, {"running": 5, "waiting": 0}],
    "count_check": None,
}


def test_the_console_table_drops_unchanged_counters_and_counts_them() -> None:
    lines = server_report(SIDE, show_unchanged=False).splitlines()
    assert lines == [
        "| Server side (/metrics, this run) | |",
        "|---|---:|",
        "| vllm:time_to_first_token_seconds:mean_delta (ms) | 6.23 |",
        "| Δ vllm:generation_tokens_total | 371 |",
        "| counters unchanged (Δ 0, listed in the results folder's summary.md) | 2 |",
        "| peak running (2 polls) | 5 |",
        "| peak waiting (2 polls) | 1 |",
        "| Δcount check | ok |",
    ]


def test_the_results_folder_table_keeps_every_counter() -> None:
    text = server_report(SIDE)
    assert "| Δ vllm:num_preemptions_total | 0 |" in text
    assert "| Δ workbench:kv_transfer_send_bytes_total | 0 |" in text
    assert "unchanged" not in text

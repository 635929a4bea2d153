"""Shared test doubles for the harness: a Target whose side-effect methods do nothing (the
runner's reads of the server side return empty), and the tiny-checkpoint tokenizer."""

from __future__ import annotations

from typing import Any

from workbench.harness.targets import Target


class QuietTarget(Target):
    """Nothing to start, stop, reset or read; subclasses answer `generate`."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def reset_prefix_cache(self) -> bool:
        return True

    def server_snapshot(self) -> dict[str, Any]:
        return {}

    def step_trace(self) -> list[dict[str, Any]]:
        return []

    def describe(self) -> dict[str, Any]:
        return {"kind": "fake"}


def encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def jsonl_error(tmp_path: Any, line: str) -> str:
    """load_jsonl's refusal of a file whose second line is `line` (the first is valid)."""
    import pytest

    from workbench.harness.workloads import load_jsonl

    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 3, "arrival_s": 1.0, '
                 '"request_id": "a"}\n' + line + "\n")
    with pytest.raises(ValueError) as e:
        load_jsonl(p)
    return str(e.value)

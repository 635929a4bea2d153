"""load_tokenizer: the Hugging Face tokenizer of a local model folder (no network, no remote
code)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"tokenizer path ({str(path)!r}) is not a local folder")
    return AutoTokenizer.from_pretrained(
        str(folder), trust_remote_code=False, local_files_only=True
    )

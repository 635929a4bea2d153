"""The harness tests' shared fixture: the tiny checkpoint's tokenizer (built once)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from workbench.models.tokenizer import load_tokenizer
    from workbench.testing import tiny_checkpoint

    return load_tokenizer(tiny_checkpoint(tmp_path_factory.mktemp("tok"), arch="llama"))

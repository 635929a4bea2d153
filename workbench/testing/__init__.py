"""Test helpers: tiny random-init Hugging Face checkpoints built locally in seconds."""

from __future__ import annotations

from workbench.testing.checkpoint import tiny_checkpoint

__all__ = ["tiny_checkpoint"]

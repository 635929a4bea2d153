"""LLM-serving research workbench: a small vLLM-semantics engine plus a measuring harness.

`LLM` is imported lazily so that pure-Python parts (scheduler, KV cache manager, configs)
load without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.worker.hugepages import prepare_torch_env

prepare_torch_env()  # before anything imports torch: huge pages for its large buffers

from workbench.sampling_params import SamplingParams  # noqa: E402

if TYPE_CHECKING:
    from workbench.engine.llm import LLM
    from workbench.engine.outputs import CompletionOutput, RequestOutput

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from workbench.engine.llm import LLM

        return LLM
    if name in ("RequestOutput", "CompletionOutput"):
        from workbench.engine import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")

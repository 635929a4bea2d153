"""torch.compile of the model forward (vLLM's `vllm/compilation`): `CompiledForward`.

The knob is `compilation_config` (`workbench.config.compilation`); the opaque attention op is
`workbench.attention.custom_op`; design and figures: docs/compile.md.
"""

from workbench.compilation.compiled_forward import CompiledForward, CompileStats

__all__ = ["CompileStats", "CompiledForward"]

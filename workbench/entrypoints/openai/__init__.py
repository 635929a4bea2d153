"""The OpenAI-compatible front door's shared parts (vLLM's `vllm/entrypoints/openai`):
`protocol/` (the wire format, see its docstring) and `cli_args.py` (`workbench serve`'s flags).
"""

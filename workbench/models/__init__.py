"""Model definitions (`llama.py`), the architecture registry (`registry.py`, a table of names),
the safetensors loader (`loader.py`) and the tokenizer loader.

Nothing is imported here, so `workbench.config` can read the registry without loading torch.
"""

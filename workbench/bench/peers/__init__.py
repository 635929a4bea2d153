"""Benchmark peers: other engines run on the same checkpoint and workload as ours.

`hf_generate` drives `transformers` in this process; `vllm_peer` drives vLLM in a subprocess
of `.venv-vllm` (`vllm_worker` is the script that runs there and imports only vllm + stdlib).
"""

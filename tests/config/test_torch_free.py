"""`workbench.config` loads without torch: the torch-free core (scheduler, KV cache manager)
and its tests import it. Run in a subprocess whose `sys.modules["torch"]` is None, so any
`import torch` on the way raises."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import json, sys
    sys.modules["torch"] = None  # `import torch` raises ImportError from here on
    from workbench.config import CacheConfig, SchedulerConfig, ModelConfig
    cache = CacheConfig(block_size=4, num_gpu_blocks_override=16)
    sched = SchedulerConfig(max_num_seqs=4, max_model_len=64)
    model = ModelConfig(model="bundled")
    print(json.dumps({
        "block_size": cache.block_size,
        "num_gpu_blocks_override": cache.num_gpu_blocks_override,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_model_len": model.max_model_len,
        "torch_loaded": sys.modules["torch"] is not None,
    }))
""")


def test_config_imports_and_builds_without_torch() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "block_size": 4,
        "num_gpu_blocks_override": 16,
        "max_num_batched_tokens": 8192,  # chunked prefill's default budget
        "max_model_len": 2048,  # the bundled checkpoint's max_position_embeddings
        "torch_loaded": False,
    }


def test_the_probe_would_see_a_torch_import() -> None:
    """The guard works: importing torch under it fails (so the test above means something)."""
    probe = 'import sys; sys.modules["torch"] = None\nimport workbench.platforms.cpu_info as c\n' \
            "c.machine_fingerprint()\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1
    assert "ModuleNotFoundError: import of torch halted; None in sys.modules" in done.stderr

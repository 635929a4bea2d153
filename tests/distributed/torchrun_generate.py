"""Run by test_external_launcher under torchrun: every rank builds the same TP engine with
distributed_executor_backend="external_launcher", generates greedily and writes
OUT_DIR/rank{r}.json = {"rank": r, "tokens": [...], "kv_bytes_per_token": n}.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/distributed/torchrun_generate.py MODEL_DIR PROMPTS_JSON ENGINE_KWARGS_JSON OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from workbench import LLM, SamplingParams


def main() -> None:
    model, prompts, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(model, distributed_executor_backend="external_launcher", **kwargs)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    rank = int(os.environ["RANK"])
    (Path(sys.argv[4]) / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank,
        "tokens": [o.outputs[0].token_ids for o in outs],
        "kv_bytes_per_token": llm.memory_readout()["kv_bytes_per_token"],
    }))
    llm.close()


if __name__ == "__main__":
    main()

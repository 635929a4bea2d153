"""The kvpress half of scripts/kvpress_compare.py; runs in .peers/kvpress's python only.

    .peers/kvpress/bin/python scripts/kvpress_side.py --model FOLDER --jobs jobs.jsonl \
        --out results.jsonl [--meta meta.json] [--threads 2]

Imports torch, transformers and kvpress, never the workbench (the peer has its own
environment). Each line of --jobs is one generation:

    {"job_id": str, "press": null | "StreamingLLMPress" | "ObservedAttentionPress" |
     "SnapKVPress" | "PyramidKVPress", "press_kwargs": {...}, "prompt_token_ids": [int],
     "question_start": null | int, "max_tokens": int, "eos_token_ids": [int]}

The token ids come from the workbench's tokenizer, so both engines see the same ids.
question_start null: the whole prompt is prefilled under the press (compressed after the
prefill, as our engine does) and the prefill's last logits give the first token.
question_start q: ids[:q] are prefilled under the press and ids[q:] are fed uncompressed
afterwards (kvpress's own context/question split). Decoding is greedy, outside the press,
at the original positions (the cache is shorter than the positions). Each result line:

    {"job_id": str, "output_token_ids": [int], "kv_tokens_per_layer": [int], "seconds": float}

kv_tokens_per_layer: cache length of each layer right after the compressed prefill.
The model is loaded locally (HF_HUB_OFFLINE=1, local_files_only), in float32, with SDPA
attention; ObservedAttentionPress's prefill runs eager (it reads the attention weights).
Decoding stays on SDPA: its single-token step needs no mask, whereas eager's mask is sized
for layer 0 and breaks on PyramidKVPress's per-layer cache lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PRESSES = ("StreamingLLMPress", "ObservedAttentionPress", "SnapKVPress", "PyramidKVPress")


def layer_lengths(cache: Any) -> list[int]:
    return [int(layer.keys.shape[-2]) for layer in cache.layers]


def run_job(model: Any, job: dict[str, Any], kvpress: Any, torch: Any,
            dynamic_cache: Any) -> dict[str, Any]:
    ids = torch.tensor([job["prompt_token_ids"]], dtype=torch.long)
    n = ids.shape[1]
    q = job.get("question_start")
    eos = set(job.get("eos_token_ids") or [])
    name = job.get("press")
    press = None
    if name is not None:
        if name not in PRESSES:
            raise ValueError(f"job {job['job_id']}: press ({name!r}) must be one of {PRESSES}")
        press = getattr(kvpress, name)(**job.get("press_kwargs", {}))
    cache = dynamic_cache()
    t0 = time.perf_counter()
    with torch.inference_mode():
        prefill = ids if q is None else ids[:, :q]
        if press is None:
            out = model(input_ids=prefill, past_key_values=cache, logits_to_keep=1)
        else:
            eager = name == "ObservedAttentionPress"  # reads the attention weights
            if eager:
                model.set_attn_implementation("eager")
            try:
                with press(model):
                    out = model(input_ids=prefill, past_key_values=cache, logits_to_keep=1)
            finally:
                if eager:
                    model.set_attn_implementation("sdpa")
        kept = layer_lengths(cache)
        if q is not None:  # the question, uncompressed, after the compressed context
            pos = torch.arange(q, n).unsqueeze(0)
            out = model(input_ids=ids[:, q:], past_key_values=cache, position_ids=pos,
                        logits_to_keep=1)
        token = int(out.logits[0, -1].argmax())
        generated = [token]
        while len(generated) < job["max_tokens"] and token not in eos:
            pos = torch.tensor([[n + len(generated) - 1]])
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                        position_ids=pos, logits_to_keep=1)
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
    return {"job_id": job["job_id"], "output_token_ids": generated,
            "kv_tokens_per_layer": kept, "seconds": round(time.perf_counter() - t0, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model folder")
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta", help="write the versions and timings here (JSON)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import kvpress
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(args.threads)
    transformers.logging.disable_progress_bar()
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        print(f"kvpress-side: --model ({args.model}) is not a local model folder", file=sys.stderr)
        return 2
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="sdpa", local_files_only=True)
    model.eval()
    jobs = [json.loads(line) for line in Path(args.jobs).read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    with open(args.out, "w") as fh:
        for i, job in enumerate(jobs):
            fh.write(json.dumps(run_job(model, job, kvpress, torch, DynamicCache)) + "\n")
            if (i + 1) % 50 == 0:
                print(f"kvpress-side: {i + 1}/{len(jobs)} jobs", flush=True)
    seconds = time.perf_counter() - t0
    versions = {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else
                _dist_version("kvpress"), "transformers": transformers.__version__,
                "torch": torch.__version__, "python": sys.version.split()[0]}
    if args.meta:
        Path(args.meta).write_text(json.dumps({"versions": versions, "jobs": len(jobs),
                                               "seconds": round(seconds, 2)}, indent=1))
    print(f"kvpress-side: {len(jobs)} jobs in {seconds:.1f} s ({versions})", flush=True)
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())

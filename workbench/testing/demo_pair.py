"""A trained demo pair for speculative decoding: a small Llama target and a smaller draft.

    python -m workbench.testing.demo_pair build [--seed 0] [--out workbench/assets]
                                               [--target-steps N] [--draft-steps N] [--sequential]
    python -m workbench.testing.demo_pair eval [--dir workbench/assets] [--max-tokens N]

Random weights make draft acceptance meaningless, so `build` trains both models from scratch
on text that ships with Python: the standard library's own `.py` sources (a fixed, sorted file
list under `sysconfig.get_paths()["stdlib"]`, without test suites, site-packages, idlelib,
lib2to3, encodings, ...). Every HOLDOUT_EVERY-th file is held out, never trained on, and
scores perplexity. The corpus therefore depends on the Python version; build_info.json
records it together with a sha256 of the corpus text.

One byte-level BPE tokenizer (VOCAB_SIZE tokens, "<s>" = 0 bos, "</s>" = 1 eos; written by
`workbench.testing.checkpoint.save_tokenizer`) is trained on the training split and saved,
byte-identical, into both folders. Both models are LlamaForCausalLM, trained in fp32 on CPU
with AdamW (linear warmup, cosine decay) for a FIXED number of steps (never a time budget) on
the same seeded stream of random windows, so the same seed on the same install gives
byte-identical weights. Each model trains on ONE torch thread, the two at once in two spawned
processes (`--sequential`: one after the other, same bytes): on a 2-core machine shared with
other work, two OpenMP threads per model ran ~3x slower per step than one. The step counts
keep the build to about a quarter of an hour on 2 free cores. Weights are saved as float16
safetensors (config.json "dtype": "float16"; the engine casts to its own dtype when loading)
and every score in build_info.json is measured on the saved weights.

`eval` recomputes the held-out perplexity of both committed folders and the draft's top-1
agreement with the target (the fraction of held-out positions where their argmaxes match).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from workbench.testing.checkpoint import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    bpe_tokenizer_json,
    save_tokenizer,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, PreTrainedModel

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
TARGET_NAME, DRAFT_NAME = "demo-target", "demo-draft"
DEMO_TARGET_DIR = ASSETS_DIR / TARGET_NAME
DEMO_DRAFT_DIR = ASSETS_DIR / DRAFT_NAME
BUILD_INFO = "build_info.json"

VOCAB_SIZE = 4096
CONTEXT = 512  # training and evaluation window (tokens)
MAX_POSITIONS = 1024  # RoPE; generation past CONTEXT works but was not trained
HOLDOUT_EVERY = 20  # files[i] with i % HOLDOUT_EVERY == 0 are held out
EXCLUDED_PARTS = frozenset(
    {
        "site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "encodings",
        "pydoc_data", "turtledemo", "ensurepip", "distutils", "__pycache__",
    }
)  # fmt: skip
WEIGHTS_DTYPE = torch.float16
NUM_THREADS = 1  # per model: 2 threads stall badly on a shared 2-core machine

_COMMON_CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    max_position_embeddings=MAX_POSITIONS,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    tie_word_embeddings=False,
    bos_token_id=BOS_TOKEN_ID,
    eos_token_id=EOS_TOKEN_ID,
    pad_token_id=None,
)
TARGET_CONFIG: dict[str, Any] = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
)
DRAFT_CONFIG: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)
BATCH_SIZE = 8
TARGET_STEPS = 500
DRAFT_STEPS = 500  # same batches as the target
TARGET_LR = 3e-3
DRAFT_LR = 3e-3
EMBED_INIT_STD = 1.0
# Prompts end where a token does: byte-level BPE spells " name" with its leading space, so
# "def " (ending in a lone " " token, never seen before a name) is off-distribution.
SAMPLE_PROMPTS = ("def", "import os\n", "class Queue:\n    def __init__(self")

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------- corpus


@dataclass(frozen=True)
class Corpus:
    """Python sources split by file: `train_*` trains the tokenizer and models, `held_out_*`
    only scores them."""

    train_files: tuple[str, ...]
    train_texts: tuple[str, ...]
    held_out_files: tuple[str, ...]
    held_out_texts: tuple[str, ...]
    source: str

    def sha256(self) -> str:
        h = hashlib.sha256()
        for name, text in zip(
            self.train_files + self.held_out_files,
            self.train_texts + self.held_out_texts,
            strict=True,
        ):
            h.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
        return h.hexdigest()

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "python_version": platform.python_version(),
            "excluded_path_parts": sorted(EXCLUDED_PARTS),
            "holdout_rule": f"sorted file list; files[i] with i % {HOLDOUT_EVERY} == 0",
            "train_files": len(self.train_files),
            "train_bytes": sum(len(t.encode()) for t in self.train_texts),
            "held_out_file_list": list(self.held_out_files),
            "held_out_bytes": sum(len(t.encode()) for t in self.held_out_texts),
            "sha256": self.sha256(),
        }


def corpus_files(stdlib: Path | None = None) -> list[str]:
    """The sorted stdlib `.py` paths (relative, posix) the corpus is built from."""
    root = Path(sysconfig.get_paths()["stdlib"]) if stdlib is None else stdlib
    names = (p.relative_to(root) for p in root.rglob("*.py") if p.is_file())
    return sorted(n.as_posix() for n in names if not EXCLUDED_PARTS & set(n.parts))


def stdlib_corpus(max_files: int | None = None, held_out_only: bool = False) -> Corpus:
    """The demo corpus (the first `max_files` files only, for quick tests); with
    `held_out_only` the training texts are not read (train_texts is empty)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = corpus_files(root)[:max_files]
    held = tuple(f for i, f in enumerate(files) if i % HOLDOUT_EVERY == 0)
    train = tuple(f for i, f in enumerate(files) if i % HOLDOUT_EVERY != 0)

    def read(names: Sequence[str]) -> tuple[str, ...]:
        return tuple((root / n).read_text(encoding="utf-8") for n in names)

    return Corpus(
        train_files=() if held_out_only else train,
        train_texts=() if held_out_only else read(train),
        held_out_files=held,
        held_out_texts=read(held),
        source=f"Python {platform.python_version()} standard library .py sources",
    )


def token_stream(tokenizer: Tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """Each text as "<s> ... </s>", concatenated into one int64 tensor."""
    ids: list[int] = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids.extend(enc.ids)  # the post-processor prepends <s>
        ids.append(EOS_TOKEN_ID)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------- training


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def llama_config(model_cfg: Mapping[str, Any], vocab_size: int) -> LlamaConfig:
    from transformers import LlamaConfig

    config = LlamaConfig(**{**_COMMON_CONFIG, "vocab_size": vocab_size, **model_cfg})
    config.architectures = ["LlamaForCausalLM"]
    return config


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _lr_at(step: int, steps: int, peak: float, warmup: int, min_ratio: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _rescale_init(model: PreTrainedModel, num_layers: int) -> None:
    """Embeddings ~ N(0, EMBED_INIT_STD) and residual-branch outputs (o_proj, down_proj) scaled
    by 1 / sqrt(2 * layers), GPT-2 style. With HF's plain N(0, 0.02) the 6-layer target sat on
    the unigram plateau (loss ~6.6) for ~60 steps, since the token's own embedding drowned in
    the layers' outputs; with this it leaves the plateau by step ~20."""
    with torch.no_grad():
        # Llama's input embeddings are an nn.Embedding; transformers types them nn.Module
        cast(torch.nn.Embedding, model.get_input_embeddings()).weight.normal_(0.0, EMBED_INIT_STD)
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(1.0 / math.sqrt(2 * num_layers))


def train_model(
    config: LlamaConfig,
    stream: torch.Tensor,
    *,
    seed: int,
    steps: int,
    lr: float,
    batch_size: int,
    context: int,
    weight_decay: float = 0.1,
    log: Log = _print,
    name: str = "model",
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Train a fresh LlamaForCausalLM on random `context`-token windows of `stream`.

    Init (HF's, then `_rescale_init`) uses `seed`, the window order a generator seeded with
    `seed` too, so models trained with one seed see the same batches. Returns the model (fp32,
    eval mode) and stats."""
    from transformers import LlamaForCausalLM

    if len(stream) < context + 2:
        raise ValueError(f"token stream ({len(stream)}) shorter than context + 2 ({context})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).float()
        _rescale_init(model, int(config.num_hidden_layers))
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,
    )
    warmup = max(1, min(50, steps // 10))
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(context + 1)
    vocab = int(config.vocab_size)
    log_every = max(1, steps // 20)
    t0 = time.perf_counter()
    ema: float | None = None
    loss_value = float("nan")
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps, lr, warmup)
        starts = torch.randint(0, len(stream) - context - 1, (batch_size, 1), generator=gen)
        batch = stream[starts + offsets]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()
        ema = loss_value if ema is None else 0.9 * ema + 0.1 * loss_value
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.perf_counter() - t0
            tok_s = (step + 1) * batch_size * context / elapsed
            eta = elapsed / (step + 1) * (steps - step - 1)
            log(
                f"[{name}] step {step + 1}/{steps} loss {loss_value:.3f} (ema {ema:.3f}) "
                f"lr {optimizer.param_groups[0]['lr']:.2e} {tok_s:.0f} tok/s "
                f"elapsed {elapsed:.0f}s eta {eta:.0f}s"
            )
    wall = time.perf_counter() - t0
    model.eval()
    stats = {
        "steps": steps,
        "batch_size": batch_size,
        "context": context,
        "tokens_seen": steps * batch_size * context,
        "epochs": round(steps * batch_size * context / len(stream), 3),
        "peak_lr": lr,
        "warmup_steps": warmup,
        "schedule": "linear warmup, cosine decay to 10% of peak",
        "optimizer": f"AdamW(betas=(0.9, 0.95), eps=1e-8, weight_decay={weight_decay}, "
        "no decay on norms), grad-norm clip 1.0",
        "precision": "float32",
        "init": f"HF normal(0, {config.initializer_range}), then embeddings normal(0, "
        f"{EMBED_INIT_STD}) and o_proj / down_proj x 1/sqrt(2 * layers)",
        "threads": torch.get_num_threads(),
        "final_train_loss": round(loss_value, 4),
        "final_train_loss_ema": round(ema if ema is not None else float("nan"), 4),
        "wall_time_s": round(wall, 1),
        "tokens_per_s": round(steps * batch_size * context / wall, 1),
    }
    return model, stats


def save_model(model: PreTrainedModel, folder: Path) -> None:
    """Save as WEIGHTS_DTYPE safetensors (+ config.json, generation_config.json)."""
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    # transformers types `to` as @wraps(nn.Module.to) on the class, an unbound _Wrapped to mypy
    cast(torch.nn.Module, model).to(WEIGHTS_DTYPE)
    model.generation_config = GenerationConfig(bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID)
    model.save_pretrained(str(folder))
    model.float()


def load_model(folder: Path) -> PreTrainedModel:
    """A demo folder as a float32 transformers model in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def load_tokenizer_fast(folder: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


# ----------------------------------------------------------------------------- evaluation


@dataclass
class PairScores:
    tokens: int
    nll: list[float]  # summed nats, per model
    correct: list[int]  # argmax == next token, per model
    agree: int  # argmax of model 0 == argmax of model 1 (pairs only)

    def perplexity(self, i: int) -> float:
        return math.exp(self.nll[i] / self.tokens)


@torch.no_grad()
def score(
    models: Sequence[torch.nn.Module],
    stream: torch.Tensor,
    context: int = CONTEXT,
    max_tokens: int | None = None,
    batch_size: int = 8,
) -> PairScores:
    """Score next-token prediction on `stream` in non-overlapping `context` windows (every
    token after the first is predicted once); with two models also count argmax agreement."""
    if max_tokens is not None:
        stream = stream[: max_tokens + 1]
    n = len(stream) - 1
    full = [s for s in range(0, n, context) if s + context <= n]
    tail = [(s, n - s) for s in range(0, n, context) if s + context > n]
    jobs = [(full[b : b + batch_size], context) for b in range(0, len(full), batch_size)]
    jobs += [([s], length) for s, length in tail]
    out = PairScores(tokens=0, nll=[0.0] * len(models), correct=[0] * len(models), agree=0)
    for starts, length in jobs:
        batch = stream[torch.tensor(starts).unsqueeze(1) + torch.arange(length + 1)]
        x, y = batch[:, :-1], batch[:, 1:]
        argmaxes = []
        for i, model in enumerate(models):
            logits = model(input_ids=x).logits.float()
            flat = logits.reshape(-1, logits.shape[-1])
            out.nll[i] += float(F.cross_entropy(flat, y.reshape(-1), reduction="sum"))
            top = logits.argmax(-1)
            out.correct[i] += int((top == y).sum())
            argmaxes.append(top)
        if len(argmaxes) == 2:
            out.agree += int((argmaxes[0] == argmaxes[1]).sum())
        out.tokens += y.numel()
    return out


def held_out_stream(folder: Path) -> torch.Tensor:
    """The held-out split of this install's stdlib, tokenized with `folder`'s tokenizer."""
    corpus = stdlib_corpus(held_out_only=True)
    return token_stream(load_tokenizer_fast(folder), corpus.held_out_texts)


def held_out_perplexity(
    model_dir: str | Path, max_tokens: int | None = None, context: int = CONTEXT
) -> float:
    """Per-token perplexity of the model in `model_dir` on the held-out stdlib files (the
    first `max_tokens` tokens only, if given)."""
    folder = Path(model_dir)
    with _threads(NUM_THREADS):
        model = load_model(folder)
        return score([model], held_out_stream(folder), context, max_tokens).perplexity(0)


@torch.no_grad()
def greedy(model: torch.nn.Module, tokenizer: Tokenizer, prompt: str, max_new: int = 48) -> str:
    """Greedy continuation of `prompt` (stops at "</s>")."""
    ids = tokenizer.encode(prompt).ids
    prompt_len = len(ids)
    for _ in range(max_new):
        nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        if nxt == EOS_TOKEN_ID:
            break
        ids.append(nxt)
    return tokenizer.decode(ids[prompt_len:], skip_special_tokens=True)


def evaluate_pair(
    target_dir: Path,
    draft_dir: Path,
    max_tokens: int | None = None,
    context: int = CONTEXT,
    corpus: Corpus | None = None,
) -> dict[str, Any]:
    """Held-out scores of both saved models and the draft's top-1 agreement with the target
    (on `corpus`'s held-out files; default: the stdlib corpus of this install)."""
    target, draft = load_model(target_dir), load_model(draft_dir)
    tokenizer = load_tokenizer_fast(target_dir)
    corpus = stdlib_corpus(held_out_only=True) if corpus is None else corpus
    stream = token_stream(tokenizer, corpus.held_out_texts)
    s = score([target, draft], stream, context, max_tokens)
    held_bytes = sum(len(t.encode()) for t in corpus.held_out_texts)
    full = max_tokens is None or max_tokens + 1 >= len(stream)
    result: dict[str, Any] = {
        "held_out_tokens": s.tokens,
        "eval_context": context,
        "target_perplexity": round(s.perplexity(0), 4),
        "draft_perplexity": round(s.perplexity(1), 4),
        "target_top1_accuracy": round(s.correct[0] / s.tokens, 4),
        "draft_top1_accuracy": round(s.correct[1] / s.tokens, 4),
        "top1_agreement": round(s.agree / s.tokens, 4),
        "uniform_perplexity": int(target.config.vocab_size),
    }
    if full:  # bits per byte only when the whole held-out text was scored
        result["held_out_bytes"] = held_bytes
        result["target_bits_per_byte"] = round(s.nll[0] / math.log(2) / held_bytes, 4)
        result["draft_bits_per_byte"] = round(s.nll[1] / math.log(2) / held_bytes, 4)
    return result


# ----------------------------------------------------------------------------- build


@dataclass(frozen=True)
class _Job:
    """One model to train and save (picklable, so it can run in its own process)."""

    role: str
    folder: Path
    model_cfg: dict[str, Any]
    vocab_size: int
    tokenizer_json: str
    stream: torch.Tensor
    seed: int
    steps: int
    lr: float
    batch_size: int
    context: int
    threads: int | None


def _train_and_save(job: _Job, log: Log | None = None) -> dict[str, Any]:
    """Train `job`'s model, save it with the tokenizer, return its build_info sections."""
    with _threads(job.threads):
        config = llama_config(job.model_cfg, job.vocab_size)
        model, stats = train_model(
            config, job.stream, seed=job.seed, steps=job.steps, lr=job.lr,
            batch_size=job.batch_size, context=job.context, log=log or _print, name=job.role,
        )  # fmt: skip
        n_params = param_count(model)
        # Llama's input embeddings are an nn.Embedding; transformers types them nn.Module
        embed = cast(torch.nn.Embedding, model.get_input_embeddings()).weight.numel()
        save_model(model, job.folder)
        save_tokenizer(job.folder, job.tokenizer_json, MAX_POSITIONS)
    return {
        "model": {
            "architecture": "LlamaForCausalLM",
            **job.model_cfg,
            "vocab_size": job.vocab_size,
            "max_position_embeddings": MAX_POSITIONS,
            "tie_word_embeddings": False,
            "params": n_params,
            "non_embedding_params": n_params - 2 * embed,
            "weights_dtype": str(WEIGHTS_DTYPE).removeprefix("torch."),
            "safetensors_bytes": (job.folder / "model.safetensors").stat().st_size,
        },
        "training": stats,
    }


def build_pair(
    out_dir: str | Path = ASSETS_DIR,
    seed: int = 0,
    target_cfg: Mapping[str, Any] = TARGET_CONFIG,
    draft_cfg: Mapping[str, Any] = DRAFT_CONFIG,
    steps: int = TARGET_STEPS,
    draft_steps: int | None = DRAFT_STEPS,
    *,
    vocab_size: int = VOCAB_SIZE,
    batch_size: int = BATCH_SIZE,
    context: int = CONTEXT,
    lr: float = TARGET_LR,
    draft_lr: float = DRAFT_LR,
    corpus: Corpus | None = None,
    eval_max_tokens: int | None = None,
    num_threads: int | None = NUM_THREADS,
    parallel: bool = False,
    samples: Sequence[str] = SAMPLE_PROMPTS,
    log: Log = _print,
) -> dict[str, Any]:
    """Train the tokenizer, the target and the draft; write `out_dir`/demo-target and
    `out_dir`/demo-draft (weights, config, tokenizer, build_info.json).

    Each model trains with `num_threads` torch threads; with `parallel` the two train at once,
    each in its own (spawned) process, which gives the same bytes as training them one after
    the other. Same arguments and seed on the same install -> byte-identical safetensors and
    tokenizer files. `draft_steps` None = `steps`. Returns the pair's scores (as in
    build_info.json) and the greedy samples."""
    t_start = time.perf_counter()
    out = Path(out_dir)
    target_dir, draft_dir = out / TARGET_NAME, out / DRAFT_NAME
    draft_steps = steps if draft_steps is None else draft_steps
    with _threads(num_threads):
        corpus = stdlib_corpus() if corpus is None else corpus
        log(
            f"corpus: {len(corpus.train_files)} train / {len(corpus.held_out_files)} held-out "
            f"files ({corpus.source})"
        )
        t = time.perf_counter()
        tok_json = bpe_tokenizer_json(corpus.train_texts, vocab_size)
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(tok_json)
        train_stream = token_stream(tokenizer, corpus.train_texts)
        tokenizer_s = time.perf_counter() - t
        log(
            f"tokenizer: vocab {tokenizer.get_vocab_size()}, {len(train_stream)} train tokens "
            f"({tokenizer_s:.1f}s)"
        )
        jobs = [
            _Job(role, folder, dict(cfg), vocab_size, tok_json, train_stream, seed, n, peak,
                 batch_size, context, num_threads)
            for role, folder, cfg, n, peak in (
                ("target", target_dir, target_cfg, steps, lr),
                ("draft", draft_dir, draft_cfg, draft_steps, draft_lr),
            )
        ]  # fmt: skip
        if parallel:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=len(jobs), mp_context=spawn) as pool:
                results = list(pool.map(_train_and_save, jobs))
        else:
            results = [_train_and_save(job, log) for job in jobs]
        infos = {job.role: result for job, result in zip(jobs, results, strict=True)}
        log("scoring the saved weights on the held-out files ...")
        t = time.perf_counter()
        scores = evaluate_pair(target_dir, draft_dir, eval_max_tokens, context, corpus)
        target, draft = load_model(target_dir), load_model(draft_dir)
        sample_text = {
            role: {p: greedy(m, tokenizer, p) for p in samples}
            for role, m in (("target", target), ("draft", draft))
        }
        log(f"scored in {time.perf_counter() - t:.1f}s: {json.dumps(scores)}")
    total = round(time.perf_counter() - t_start, 1)
    common = {
        "command": f"python -m workbench.testing.demo_pair build --seed {seed}",
        "seed": seed,
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "tokenizers_version": _version("tokenizers"),
        "corpus": {**corpus.describe(), "train_tokens": len(train_stream)},
        "tokenizer": {
            "type": "byte-level BPE (tokenizers), trained on the training split",
            "vocab_size": vocab_size,
            "special_tokens": {"<s>": BOS_TOKEN_ID, "</s>": EOS_TOKEN_ID},
            "train_time_s": round(tokenizer_s, 1),
        },
        "pair": scores,
        "top1_agreement": scores["top1_agreement"],
        "build_wall_time_s": total,
    }
    for role, folder in (("target", target_dir), ("draft", draft_dir)):
        info = {
            "name": folder.name,
            "role": role,
            "held_out_perplexity": scores[f"{role}_perplexity"],
            **common,
            **infos[role],
            "greedy_samples": sample_text[role],
        }
        (folder / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"build done in {total:.0f}s -> {target_dir}, {draft_dir}")
    return {**scores, "build_wall_time_s": total, "samples": sample_text}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ----------------------------------------------------------------------------- CLI


def _summary(target_dir: Path, draft_dir: Path, scores: Mapping[str, Any]) -> str:
    rows = []
    for role, folder in (("target", target_dir), ("draft", draft_dir)):
        info_path = folder / BUILD_INFO
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        params = info.get("model", {}).get("params", "?")
        size = (folder / "model.safetensors").stat().st_size / 1e6
        rows.append(
            f"  {folder.name:12s} params {params:>9}  {size:5.1f} MB  held-out perplexity "
            f"{scores[f'{role}_perplexity']:.2f}"
            + (
                f"  (build_info: {info['held_out_perplexity']:.2f})"
                if "held_out_perplexity" in info
                else ""
            )
        )
    rows.append(
        f"  draft top-1 agreement with target: {scores['top1_agreement']:.3f} on "
        f"{scores['held_out_tokens']} held-out tokens (uniform perplexity "
        f"{scores['uniform_perplexity']})"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.testing.demo_pair",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train the tokenizer, target and draft; write the folders")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", type=Path, default=ASSETS_DIR, help="parent folder of the pair")
    b.add_argument("--target-steps", type=int, default=TARGET_STEPS)
    b.add_argument("--draft-steps", type=int, default=DRAFT_STEPS)
    b.add_argument(
        "--sequential", action="store_true", help="train one model after the other (same bytes)"
    )
    e = sub.add_parser("eval", help="held-out perplexity of both models in a folder")
    e.add_argument("--dir", type=Path, default=ASSETS_DIR, help="parent folder of the pair")
    e.add_argument("--max-tokens", type=int, default=None, help="score only the first N")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build_pair(
            args.out,
            args.seed,
            steps=args.target_steps,
            draft_steps=args.draft_steps,
            parallel=not args.sequential,
        )
        parent = args.out
        info = json.loads((parent / TARGET_NAME / BUILD_INFO).read_text())
        print(_summary(parent / TARGET_NAME, parent / DRAFT_NAME, info["pair"]))
    else:
        parent = args.dir
        with _threads(NUM_THREADS):
            scores = evaluate_pair(parent / TARGET_NAME, parent / DRAFT_NAME, args.max_tokens)
        print(f"Python {platform.python_version()} ({sys.executable})")
        print(_summary(parent / TARGET_NAME, parent / DRAFT_NAME, scores))
    return 0


if __name__ == "__main__":  # run main from the imported module so workers can unpickle jobs
    from workbench.testing.demo_pair import main as _main

    raise SystemExit(_main())

"""tiny_checkpoint: write a small random-init Llama/Qwen2/Qwen3/Mistral folder for tests.

The folder looks like a Hub download: config.json, generation_config.json, model.safetensors
(via transformers' `from_config` + `save_pretrained`) and a byte-level BPE tokenizer
(tokenizer.json + tokenizer_config.json) trained with `tokenizers` on a fixed list of Python
stdlib source files. Same arguments -> byte-identical files on the same Python install.

Special tokens: "<s>" = 0 (bos, prepended by the tokenizer) and "</s>" = 1 (eos, written to
config.json and generation_config.json). The tokenizer depends only on vocab_size (not on the
seed) and is trained once per process per vocab_size; the stdlib text yields ~12k tokens, so
a larger vocab_size is filled up with special "<extra_i>" tokens (len(tokenizer) == vocab_size).

Init: transformers' normal(0, initializer_range), with initializer_range defaulting to
default_initializer_range(hidden_size) = 1.6 / sqrt(hidden_size) (0.2 at the default width 64,
~0.07 at 512) instead of HF's 0.02. Logits then spread with std ~1.6 at any width, so top-1/top-2
gaps (median ~0.35, 1st percentile ~5e-3) dwarf fp32 accumulation noise (~1e-6) and greedy
comparisons with transformers stay stable, while attention stays soft (a fixed 0.2 would make it
near one-hot at width 512). RMSNorm weights are set to 1 + 0.1 * N(0, 1) and biases to
N(0, initializer_range) instead of HF's ones / zeros, so a mis-routed norm or bias changes
the outputs.
"""

from __future__ import annotations

import functools
import math
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

TARGET_LOGIT_STD = 1.6
DEFAULT_VOCAB_SIZE = 1024
BOS_TOKEN, EOS_TOKEN = "<s>", "</s>"
BOS_TOKEN_ID, EOS_TOKEN_ID = 0, 1
_TOKENIZER_FILES = (
    "argparse.py", "textwrap.py", "difflib.py", "inspect.py", "typing.py", "dataclasses.py",
    "pydoc.py", "functools.py", "collections/__init__.py", "json/decoder.py",
    "email/message.py", "string.py",
)  # fmt: skip
_ARCHS: dict[str, tuple[str, str]] = {  # arch -> (config class, architecture name)
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def default_initializer_range(hidden_size: int) -> float:
    """The init std giving logits of std ~TARGET_LOGIT_STD (1.6 / sqrt(hidden), 4 decimals)."""
    return round(TARGET_LOGIT_STD / math.sqrt(hidden_size), 4)


def _tiny_defaults(arch: str, vocab_size: int) -> dict[str, Any]:
    defaults: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=None,
    )
    if arch == "mistral":
        defaults["sliding_window"] = None  # full attention, like Mistral v0.2+
    return defaults


@functools.lru_cache(maxsize=8)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """A byte-level BPE tokenizer (as tokenizer.json text) trained on stdlib sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in _TOKENIZER_FILES]
    return bpe_tokenizer_json(texts, vocab_size)


def bpe_tokenizer_json(texts: Sequence[str], vocab_size: int) -> str:
    """A byte-level BPE tokenizer trained on `texts`, as tokenizer.json text.

    "<s>" = 0 (bos, prepended by the post-processor), "</s>" = 1; if the text supports fewer
    than vocab_size tokens the rest are special "<extra_i>" tokens (len == vocab_size).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    learned = tok.get_vocab_size()  # the text supports ~12k tokens; pad bigger vocabs
    tok.add_special_tokens([f"<extra_{i}>" for i in range(vocab_size - learned)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)],
    )
    return tok.to_str()


def _save_tokenizer(folder: Path, vocab_size: int, model_max_length: int) -> None:
    save_tokenizer(folder, _trained_tokenizer_json(vocab_size), model_max_length)


def save_tokenizer(folder: str | Path, tokenizer_json: str, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `folder`
    (bos "<s>", eos "</s>", the test chat template) for a `bpe_tokenizer_json` tokenizer."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tokenizer_json)
    wrapper = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=model_max_length,
        chat_template=_CHAT_TEMPLATE,
    )
    wrapper.save_pretrained(str(folder))


def _perturb(model: torch.nn.Module, std: float) -> None:
    """Make norm weights and biases non-trivial (HF initialises them to ones / zeros)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(std * torch.randn_like(param))


def tiny_checkpoint(
    dir: str | Path,  # noqa: A002 (the public name callers use)
    arch: str = "llama",
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Write a tiny random-init `arch` checkpoint into `dir` and return its path.

    arch: "llama" | "qwen2" | "qwen3" | "mistral". `overrides` are config fields
    (hidden_size=512, num_hidden_layers=8, vocab_size=8192, tie_word_embeddings=True,
    rope_scaling={...}, ...); vocab_size also sets the tokenizer's size.
    """
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    if arch not in _ARCHS:
        raise ValueError(f"arch ({arch!r}) must be one of {', '.join(_ARCHS)}")
    config_cls_name, arch_name = _ARCHS[arch]
    kwargs = {**_tiny_defaults(arch, DEFAULT_VOCAB_SIZE), **overrides}
    kwargs.setdefault("initializer_range", default_initializer_range(kwargs["hidden_size"]))
    if kwargs["vocab_size"] < 258:
        raise ValueError(
            f"vocab_size ({kwargs['vocab_size']}) must be >= 258 (256 byte tokens + <s> + </s>)"
        )
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    config = getattr(transformers, config_cls_name)(**kwargs)
    config.architectures = [arch_name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _perturb(model, float(config.initializer_range))
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id
    )
    model.save_pretrained(str(folder))
    _save_tokenizer(folder, int(config.vocab_size), int(config.max_position_embeddings))
    return folder

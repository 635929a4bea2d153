"""Our paged LlamaForCausalLM vs transformers, fp32 on CPU, through hand-built AttentionMetadata.

Every scenario feeds fixed token lists (teacher forcing) through the engine-style interface and
compares each new token's logits with transformers' full-sequence logits at that position.
Block ids come from a shuffled pool, so block tables are non-contiguous; the caches start full
of finite garbage (like reused blocks), so anything read beyond seq_len would show.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from workbench.attention import torch_backend
from workbench.attention.metadata import AttentionMetadata
from workbench.attention.selector import get_attention_backend
from workbench.config import ModelConfig
from workbench.layers.rotary import compute_inv_freq, get_rope_config
from workbench.models.loader import get_model_class, load_model
from workbench.models.tokenizer import load_tokenizer
from workbench.testing import tiny_checkpoint

CPU = torch.device("cpu")
LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}  # fmt: skip
VARIANTS: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {}),
    "llama3_rope": ("llama", {"rope_scaling": LLAMA3_ROPE}),
    "qwen3_tied": ("qwen3", {"tie_word_embeddings": True}),
    "llama_mqa": ("llama", {"num_key_value_heads": 1}),
    "llama_bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
}


@pytest.fixture(scope="module")
def ckpt_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return {
        name: tiny_checkpoint(root / name, arch, seed=i, **ov)
        for i, (name, (arch, ov)) in enumerate(VARIANTS.items())
    }


@dataclass
class Seq:
    tokens: list[int]  # the whole sequence, fed teacher-forced
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0


class Runner:
    """A minimal model runner: allocates shuffled blocks, builds metadata, runs one step."""

    def __init__(self, model: torch.nn.Module, mc: ModelConfig, block_size: int, seed: int):
        self.model, self.block_size = model, block_size
        num_blocks = 64 * 16 // block_size + 1
        self.free = list(range(1, num_blocks))  # block 0 = null block
        random.Random(seed).shuffle(self.free)
        shape = (2, num_blocks, block_size, mc.num_kv_heads, mc.head_dim)
        dtype = model.lm_head.weight.dtype
        self.kv_caches = [torch.randn(shape).to(dtype) * 3 for _ in range(mc.num_layers)]
        self.null_blocks = [c[:, 0].clone() for c in self.kv_caches]
        model.bind_kv_cache(self.kv_caches)

    def allocate(self, seq: Seq, num_tokens: int) -> None:
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self.free.pop())

    def step(self, work: list[tuple[Seq, int]], num_pad: int = 0) -> list[torch.Tensor]:
        """Run `n` new tokens of each (seq, n); returns each seq's logits [n, vocab]."""
        bs = self.block_size
        ids, pos, slots, q_lens, s_lens = [], [], [], [], []
        for seq, n in work:
            end = seq.num_computed + n
            self.allocate(seq, end)
            for p in range(seq.num_computed, end):
                ids.append(seq.tokens[p])
                pos.append(p)
                slots.append(seq.block_table[p // bs] * bs + p % bs)
            q_lens.append(n)
            s_lens.append(end)
        ids += [0] * num_pad
        pos += [0] * num_pad
        slots += [-1] * num_pad
        width = max(len(s.block_table) for s, _ in work) + 1  # + 1 null-padded column
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s, _ in work]
        md = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            query_start_loc=torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()]),
            seq_lens=torch.tensor(s_lens),
            block_tables=torch.tensor(tables),
            query_lens_cpu=q_lens,
            seq_lens_cpu=s_lens,
            max_query_len=max(q_lens),
            max_seq_len=max(s_lens),
        )
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids), torch.tensor(pos), md)
            logits = self.model.compute_logits(hidden)
        assert hidden.shape == (len(ids), self.model.arch.hidden_size)
        out, start = [], 0
        for seq, n in work:
            out.append(logits[start : start + n])
            seq.num_computed += n
            start += n
        return out


def hf_logits(folder: Path, seqs: list[list[int]]) -> list[torch.Tensor]:
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [ref(torch.tensor([s])).logits[0] for s in seqs]


def assert_matches(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")
    assert torch.equal(got.argmax(-1), ref.argmax(-1)), what


CASES = [(v, 4, None) for v in VARIANTS] + [("llama", 16, None), ("qwen3", 16, None)]
CASES += [("llama_mqa", 4, 1), ("qwen3", 16, 30000)]  # decode gathers 1 / a few seqs at a time


@pytest.mark.parametrize(("variant", "block_size", "chunk_bytes"), CASES)
def test_matches_transformers(
    ckpt_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
    block_size: int,
    chunk_bytes: int | None,
) -> None:
    if chunk_bytes is not None:
        monkeypatch.setattr(torch_backend, "DECODE_CHUNK_BYTES", chunk_bytes)
    folder = ckpt_dirs[variant]
    mc = ModelConfig(model=str(folder))
    model = load_model(mc, dtype=torch.float32, device=CPU)
    runner = Runner(model, mc, block_size, seed=block_size)
    g = torch.Generator().manual_seed(7)
    vocab = model.arch.vocab_size

    def rand(n: int) -> list[int]:
        return torch.randint(2, vocab, (n,), generator=g).tolist()

    bs, decodes = block_size, 4
    a = Seq(rand(2 * bs + 5 + decodes))  # full prefill, then decodes
    b = Seq(rand(3 + decodes))  # short prompt
    e = Seq(rand(bs + 1 + decodes))
    c = Seq(rand(3 * bs + 2 + 2))  # chunked prefill in 3 chunks, then 2 decodes
    d = Seq(a.tokens[: 2 * bs] + rand(6 + decodes))  # prefix hit on a's 2 full blocks
    refs = dict(zip("abecd", hf_logits(folder, [s.tokens for s in (a, b, e, c, d)]), strict=True))
    got: dict[str, list[torch.Tensor]] = {k: [] for k in "abecd"}

    # step 1: a, b, e prefill in one flat batch with c's first chunk and d, whose prompt
    # reuses a's first two blocks *being written by this very batch* (read-after-write;
    # d comes first in the batch, so order within the batch must not matter).
    runner.allocate(a, len(a.tokens) - decodes)
    d.block_table, d.num_computed = a.block_table[:2], 2 * bs
    chunk = [bs + 1, bs, bs + 1]
    work = [(d, len(d.tokens) - decodes - 2 * bs), (a, len(a.tokens) - decodes), (b, 3),
            (e, bs + 1), (c, chunk[0])]  # fmt: skip
    for key, logits in zip("dabec", runner.step(work), strict=True):
        got[key].append(logits)
    # steps 2-3: decodes batched with c's remaining chunks
    for ch in chunk[1:]:
        out = runner.step([(a, 1), (b, 1), (c, ch), (e, 1), (d, 1)])
        for key, logits in zip("abced", out, strict=True):
            got[key].append(logits)
    # steps 4-5: pure decode batches, the last one with two padding tokens (slot -1)
    for num_pad in (0, 2):
        out = runner.step([(s, 1) for s in (a, b, e, c, d)], num_pad=num_pad)
        for key, logits in zip("abecd", out, strict=True):
            got[key].append(logits)
    assert all(s.num_computed == len(s.tokens) for s in (a, b, e, c, d))
    for key, seq in zip("abecd", (a, b, e, c, d), strict=True):
        ours = torch.cat(got[key])
        start = len(seq.tokens) - ours.shape[0]
        assert_matches(ours, refs[key][start:], f"{variant} bs={bs} seq {key}")
    for cache, null in zip(runner.kv_caches, runner.null_blocks, strict=True):
        assert torch.equal(cache[:, 0], null), "the null block must never be written"


def _copy_ckpt(src: Path, dst: Path, **config_changes: object) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config_changes}))
    return dst


def _one_batch_logits(folder: Path) -> torch.Tensor:
    """Logits of one 9-token prefill (block_size 4) through a freshly loaded model."""
    mc = ModelConfig(model=str(folder))
    model = load_model(mc, dtype=torch.float32, device=CPU)
    seq = Seq(list(range(2, 11)))
    return Runner(model, mc, block_size=4, seed=0).step([(seq, 9)])[0]


def test_sharded_checkpoint_loads_identically(ckpt_dirs: dict[str, Path], tmp_path: Path) -> None:
    folder = ckpt_dirs["llama"]
    sharded = tmp_path / "sharded"
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ref.save_pretrained(sharded, max_shard_size="40KB")
    assert len(list(sharded.glob("*.safetensors"))) > 2
    assert (sharded / "model.safetensors.index.json").is_file()
    save_file(
        {"layers.0.attention.wq.weight": torch.zeros(1)}, sharded / "consolidated.safetensors"
    )
    a = load_model(ModelConfig(model=str(folder)), torch.float32, CPU)
    b = load_model(ModelConfig(model=str(sharded)), torch.float32, CPU)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_old_style_rope_keys_match_new(ckpt_dirs: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy_ckpt(ckpt_dirs["llama3_rope"], tmp_path / "old")
    cfg = json.loads((folder / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type")}
    cfg.update(rope_theta=params["rope_theta"], rope_scaling={"type": "llama3", **scaling})
    (folder / "config.json").write_text(json.dumps(cfg))
    assert get_rope_config(cfg) == get_rope_config(json.loads(
        (ckpt_dirs["llama3_rope"] / "config.json").read_text()))  # fmt: skip
    torch.testing.assert_close(
        _one_batch_logits(folder), _one_batch_logits(ckpt_dirs["llama3_rope"]), atol=0, rtol=0
    )
    theta, scaling = get_rope_config({"rope_theta": 5e5})
    assert (theta, scaling["rope_type"]) == (5e5, "default")
    assert not torch.equal(compute_inv_freq(16, 1e4, None), compute_inv_freq(16, 1e4, LLAMA3_ROPE))


def test_unsupported_rope_type(ckpt_dirs: dict[str, Path], tmp_path: Path) -> None:
    rope = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    folder = _copy_ckpt(ckpt_dirs["llama"], tmp_path / "yarn", rope_parameters=rope)
    with pytest.raises(ValueError, match="rope_type \\('yarn'\\).*default, llama3"):
        load_model(ModelConfig(model=str(folder)), torch.float32, CPU)


def test_unsupported_architecture(ckpt_dirs: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy_ckpt(ckpt_dirs["llama"], tmp_path / "gpt2", architectures=["GPT2LMHeadModel"])
    supported = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM"
    with pytest.raises(ValueError, match=f"'GPT2LMHeadModel'.*{supported}"):
        load_model(ModelConfig(model=str(folder)), torch.float32, CPU)
    with pytest.raises(ValueError, match=f"'GPT2LMHeadModel'.*{supported}"):
        get_model_class("GPT2LMHeadModel")


def test_sliding_window_shorter_than_max_model_len(ckpt_dirs: dict[str, Path], tmp_path: Path):
    folder = _copy_ckpt(ckpt_dirs["mistral"], tmp_path / "swa", sliding_window=64)
    with pytest.raises(ValueError, match="sliding_window \\(64\\).*max_model_len <= 64"):
        load_model(ModelConfig(model=str(folder)), torch.float32, CPU)
    load_model(ModelConfig(model=str(folder), max_model_len=64), torch.float32, CPU)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("drop", "missing.*model.layers.1.self_attn.k_proj.weight"),
        ("drop_head", "missing.*lm_head.weight"),
        ("extra", "match no model parameter: model.layers.0.mlp.extra_proj.weight"),
        ("shape", "cannot load model.layers.0.mlp.up_proj.weight.*\\(128, 63\\).*\\(128, 64\\)"),
    ],
)
def test_bad_weights(ckpt_dirs: dict[str, Path], tmp_path: Path, edit: str, message: str) -> None:
    folder = _copy_ckpt(ckpt_dirs["llama"], tmp_path / edit)
    tensors = load_file(folder / "model.safetensors")
    if edit == "drop":
        del tensors["model.layers.1.self_attn.k_proj.weight"]
    elif edit == "drop_head":
        del tensors["lm_head.weight"]
    elif edit == "extra":
        tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    else:
        tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(128, 63)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        load_model(ModelConfig(model=str(folder)), torch.float32, CPU)


def test_bind_kv_cache_and_backend_checks(ckpt_dirs: dict[str, Path]) -> None:
    mc = ModelConfig(model=str(ckpt_dirs["llama"]))
    model = load_model(mc, torch.float32, CPU)
    with pytest.raises(ValueError, match="got 1 KV cache tensors for 2 layers"):
        model.bind_kv_cache([torch.zeros(2, 4, 4, 2, 16)])
    with pytest.raises(ValueError, match="expected \\[2, num_blocks, block_size, 2, 16\\]"):
        model.bind_kv_cache([torch.zeros(2, 4, 4, 4, 16)] * 2)
    with pytest.raises(ValueError, match="attention backend \\('flash'\\).*allowed: torch"):
        get_attention_backend("flash")
    with pytest.raises(ValueError, match="allowed: torch"):
        load_model(mc, torch.float32, CPU, attention_backend="flash")
    assert get_attention_backend("torch").name == "torch"


def test_load_tokenizer(ckpt_dirs: dict[str, Path]) -> None:
    tok = load_tokenizer(ckpt_dirs["qwen2"])
    ids = tok("def f(x):\n    return x")["input_ids"]
    assert ids[0] == tok.bos_token_id == 0
    assert tok.decode(ids, skip_special_tokens=True) == "def f(x):\n    return x"
    assert ModelConfig(model=str(ckpt_dirs["qwen2"])).eos_token_ids == [tok.eos_token_id] == [1]


def test_bfloat16_load(ckpt_dirs: dict[str, Path]) -> None:
    mc = ModelConfig(model=str(ckpt_dirs["qwen3"]))
    work = [(Seq(list(range(2, 30))), 28)]
    fp32 = Runner(load_model(mc, torch.float32, CPU), mc, 4, 0).step(work)
    work[0][0].num_computed = 0
    model = load_model(mc, torch.bfloat16, CPU)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary_emb.cos_cache.dtype == torch.float32  # RoPE table stays fp32
    bf16 = Runner(model, mc, 4, 0).step(work)
    assert bf16[0].dtype == torch.float32  # compute_logits upcasts
    assert torch.nn.functional.cosine_similarity(bf16[0], fp32[0], dim=-1).min() > 0.99


def test_every_registered_architecture_resolves_to_its_class() -> None:
    """The registry is names only (config reads it without torch); each row must import."""
    from workbench.models import llama, registry

    for arch in registry.SUPPORTED_ARCHITECTURES:
        cls = get_model_class(arch)
        assert cls.__name__ == registry.MODELS[arch][1]
        if cls is llama.LlamaForCausalLM:
            assert arch in llama.FAMILIES  # LlamaArch resolves its per-family differences
    assert set(llama.FAMILIES) <= set(registry.MODELS)

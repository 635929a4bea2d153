"""CPU linear backends: each equals F.linear to fp32 rounding; the autotune picks exactly the
backend the injected timings say; the cache is keyed per machine; a forced backend is used
everywhere; greedy tokens equal transformers' with every backend forced."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.layers import linear_autotune as la
from workbench.layers import linear_backend as lb
from workbench.layers.linear_autotune import TimingCache, choose_plan, tune_shapes
from workbench.layers.linear_backend import PROBE_ROWS, LinearPlan

AVAILABLE = lb.available_backends()
PACKED = [b for b in lb.PACKED_BACKENDS if b in AVAILABLE]
ALL = ("torch", "mkl", "onednn")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(lb.BACKEND_ENV, raising=False)
    monkeypatch.delenv(lb.LEGACY_PACKED_ENV, raising=False)
    monkeypatch.setenv(la.CACHE_ENV, str(tmp_path / "cache"))


def table(**rows: tuple[float, float, float]) -> dict[int, dict[str, float]]:
    """Timings per probe: p1=(torch, mkl, onednn), p16=..., missing probes copy the last."""
    out, last = {}, (1.0, 1.0, 1.0)
    for probe in PROBE_ROWS:
        last = rows.get(f"p{probe}", last)
        out[probe] = dict(zip(ALL, last, strict=True))
    return out


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("backend", AVAILABLE)
@pytest.mark.parametrize("rows", [1, 3, 16, 37, 64, 256, 600])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (512, 1408), (1408, 512)])
def test_every_backend_equals_f_linear_to_fp32_rounding(backend: str, rows: int, k: int,
                                                        n: int) -> None:
    g = torch.Generator().manual_seed(rows * 7 + k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    packed = lb.pack(backend, w)
    x = torch.randn(rows, 2 * k, generator=g)[:, :k]  # strided, like SiluAndMul's view
    exact_mm = x.double() @ w.double().t()
    bound = 4 * k * torch.finfo(torch.float32).eps * (x.abs().double() @ w.abs().double().t())
    for bias in (None, b):
        got = lb.run(backend, x, w, bias, packed)
        ref = F.linear(x, w, bias)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        exact = exact_mm + (0 if bias is None else bias.double())
        assert ((got.double() - exact).abs() <= bound + 1e-6).all()
        assert ((ref.double() - exact).abs() <= bound + 1e-6).all()
        # got and ref are each within fp32 rounding of the exact product; no tighter
        # element-wise match between them is promised (oneDNN on an AMX Xeon differed from
        # F.linear by 1.1e-4 at k = 1408, inside the bound, in 2 of 307,200 elements)


def test_linear_routes_each_row_bucket_to_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []

    def spy(backend: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
            packed: torch.Tensor | None) -> torch.Tensor:
        calls.append((backend, x.shape[0]))
        return F.linear(x, w, bias)

    monkeypatch.setattr(lb, "run", spy)
    w = torch.randn(8, 4)
    plan = LinearPlan((8, 4), "mkl", ("mkl", "torch", "mkl", "torch", "mkl"), "forced")
    for rows in (1, 3, 4, 31, 32, 127, 128, 511, 512, 5000):
        assert lb.linear(torch.randn(rows, 4), w, None, None, plan).shape == (rows, 8)
    assert calls == [("mkl", 1), ("mkl", 3), ("mkl", 32), ("mkl", 127), ("mkl", 512),
                     ("mkl", 5000)]
    calls.clear()
    lb.linear(torch.randn(0, 4), w, None, None, plan)  # empty batch
    lb.linear(torch.randn(2, 3, 4), w, None, None, plan)  # not 2-D
    lb.linear(torch.randn(2, 4), w, None, None, None)  # no plan
    assert calls == []


def test_plan_rejects_a_backend_it_has_not_packed() -> None:
    with pytest.raises(ValueError, match="must each be 'torch' or the packed backend"):
        LinearPlan((8, 4), "mkl", ("onednn",) * 5, "forced")
    with pytest.raises(ValueError, match="one backend per row bucket"):
        LinearPlan((8, 4), None, ("torch",), "forced")


# ------------------------------------------------------------------ choosing
def test_choice_follows_the_injected_timings() -> None:
    # onednn fastest everywhere
    plan = choose_plan((8, 4), table(p1=(10, 9, 5)), ALL, "measured")
    assert (plan.packed, plan.backends) == ("onednn", ("onednn",) * 5)
    # mkl wins decode sizes, torch wins prefill sizes
    t = table(p1=(10, 6, 12), p16=(10, 6, 12), p64=(10, 8, 12), p256=(10, 11, 12))
    plan = choose_plan((8, 4), t, ALL, "measured")
    assert plan.packed == "mkl"
    assert plan.backends == ("mkl", "mkl", "mkl", "torch", "torch")
    # mkl wins 1 row a little, onednn wins everything else by 2x: one packed copy, onednn
    t = table(p1=(10, 8, 11), p16=(10, 9, 5))
    plan = choose_plan((8, 4), t, ALL, "measured")
    assert plan.packed == "onednn"
    assert plan.backends == ("torch", "onednn", "onednn", "onednn", "onednn")
    assert plan.describe() == "1..3 torch, 4.. onednn"


def test_no_packed_copy_unless_min_gain_is_beaten() -> None:
    plan = choose_plan((8, 4), table(p1=(10.0, 9.6, 9.7)), ALL, "measured")  # 4% and 3%
    assert (plan.packed, plan.backends) == (None, ("torch",) * 5)
    plan = choose_plan((8, 4), table(p1=(10.0, 9.4, 9.7)), ALL, "measured")  # 6%: mkl
    assert plan.packed == "mkl"


def test_ties_and_unavailable_backends() -> None:
    plan = choose_plan((8, 4), table(p1=(10, 5, 5)), ALL, "measured")
    assert plan.packed == "mkl"  # tie: PACKED_BACKENDS order
    plan = choose_plan((8, 4), table(p1=(10, 1, 5)), ("torch", "onednn"), "measured")
    assert plan.packed == "onednn"  # mkl not available on this build


# ------------------------------------------------------------------ cache
class Recorder:
    """An injected measurement: returns `timings`, records what it was asked."""

    def __init__(self, timings: dict[int, dict[str, float]]) -> None:
        self.timings = timings
        self.calls: list[tuple[tuple[int, int], list[int], list[str]]] = []

    def __call__(self, shape: tuple[int, int], probes: Sequence[int],
                 backends: Sequence[str]) -> dict[int, dict[str, float]]:
        self.calls.append((shape, list(probes), list(backends)))
        return {r: {b: self.timings[r][b] for b in backends} for r in probes}


def test_miss_measures_then_hit_reuses(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    measure = Recorder(table(p1=(10, 9, 5)))
    cache = TimingCache(path, key="cpu=A")
    plans = tune_shapes([(8, 4), (8, 4), (16, 4)], ALL, cache, measure)
    assert [c[0] for c in measure.calls] == [(8, 4), (16, 4)]  # each shape once
    assert measure.calls[0][1:] == (list(PROBE_ROWS), list(ALL))
    assert {p.source for p in plans.values()} == {"measured"}
    data = json.loads(path.read_text())
    assert data["machines"]["cpu=A"]["8x4"]["16"] == {"torch": 10, "mkl": 9, "onednn": 5}
    again = tune_shapes([(8, 4), (16, 4)], ALL, TimingCache(path, key="cpu=A"), measure)
    assert len(measure.calls) == 2  # no new measurement
    assert all(p.source == "cache" and p.tune_s == 0.0 for p in again.values())
    assert again[(8, 4)].backends == plans[(8, 4)].backends


def test_cache_is_keyed_by_cpu_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.json"
    monkeypatch.setattr(la, "cpu_model_name", lambda: "AMD EPYC")
    epyc = la.machine_key()
    assert epyc.startswith("cpu=AMD EPYC; isa=") and f"torch={torch.__version__}" in epyc
    assert f"threads={torch.get_num_threads()}" in epyc
    tune_shapes([(8, 4)], ALL, TimingCache(path), Recorder(table(p1=(10, 9, 5))))
    monkeypatch.setattr(la, "cpu_model_name", lambda: "Intel Xeon")
    measure = Recorder(table(p1=(10, 5, 9)))
    plans = tune_shapes([(8, 4)], ALL, TimingCache(path), measure)
    assert len(measure.calls) == 1 and plans[(8, 4)].packed == "mkl"  # a miss: other CPU
    machines = json.loads(path.read_text())["machines"]
    assert sorted(machines) == sorted([epyc, la.machine_key()])


def test_only_missing_probes_and_backends_are_measured(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    tune_shapes([(8, 4)], ("torch", "mkl"), TimingCache(path, key="k"),
                Recorder(table(p1=(10, 9, 5))))
    measure = Recorder(table(p1=(10, 9, 5)))
    plans = tune_shapes([(8, 4)], ALL, TimingCache(path, key="k"), measure)
    assert measure.calls == [((8, 4), list(PROBE_ROWS), list(ALL))]  # onednn was missing
    assert plans[(8, 4)].packed == "onednn"


def test_cache_path_env_and_unreadable_file(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(la.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert la.default_cache_path() == tmp_path / "elsewhere" / "linear_backends.json"
    monkeypatch.delenv(la.CACHE_ENV)
    assert la.default_cache_path() == Path.home() / ".cache" / "workbench" / la.CACHE_FILE
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    measure = Recorder(table(p1=(10, 9, 5)))
    tune_shapes([(8, 4)], ALL, TimingCache(bad, key="k"), measure)
    assert len(measure.calls) == 1 and "8x4" in json.loads(bad.read_text())["machines"]["k"]


def test_wall_clock_measure_takes_medians_of_interleaved_rounds() -> None:
    ticks = iter(range(10_000))
    out = la.measure_wall((8, 4), [1, 16], ("torch", "mkl") if "mkl" in AVAILABLE
                          else ("torch",), clock=lambda: float(next(ticks)))
    assert sorted(out) == [1, 16] and all(v == 1.0 for t in out.values() for v in t.values())


def test_residency_and_stream_footprint() -> None:
    mib = 1 << 20
    assert la.weight_residency(27 * mib, llc_bytes=32 * mib) == "resident"
    assert la.weight_residency(108 * mib, llc_bytes=32 * mib) == "streamed"
    assert la.weight_residency(40 * mib, llc_bytes=0) == "streamed"  # unknown: 32 MiB assumed
    assert la.stream_footprint(27 * mib, llc_bytes=32 * mib) == 0
    assert la.stream_footprint(108 * mib, llc_bytes=32 * mib) == 64 * mib  # 2 x the cache
    assert la.stream_footprint(40 * mib, llc_bytes=16 * mib) == 40 * mib  # the model's own
    assert la.stream_footprint(600 * mib, llc_bytes=256 * mib) == 512 * mib
    assert la.machine_key("streamed").endswith("; weights=streamed")


def test_streamed_measure_rotates_through_weight_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    used: dict[str, list[int]] = {"torch": []}

    def runner(backend: str, weight: torch.Tensor):  # type: ignore[no-untyped-def]
        return lambda x: used[backend].append(id(weight))

    monkeypatch.setattr(lb, "runner", runner)
    ticks = iter(range(10_000))
    # an 8x4 fp32 weight is 128 bytes: 512 bytes streamed = 4 copies, one per call in turn
    la.measure_wall((8, 4), [1], ("torch",), clock=lambda: float(next(ticks)),
                    min_rounds=7, max_rounds=7, stream_bytes=512)
    assert len(used["torch"]) == 8 and len(set(used["torch"])) == 4
    assert used["torch"][:4] == used["torch"][4:]
    used["torch"].clear()
    la.measure_wall((8, 4), [1], ("torch",), clock=lambda: float(next(ticks)),
                    min_rounds=3, max_rounds=3, stream_bytes=10**9)
    assert len(set(used["torch"])) == 4  # 1 warm-up + 3 rounds, of MAX_STREAM_COPIES (64)
    used["torch"].clear()
    la.measure_wall((8, 4), [1], ("torch",), clock=lambda: float(next(ticks)),
                    min_rounds=3, max_rounds=3)
    assert len(set(used["torch"])) == 1  # resident: one weight


def test_auto_mode_keys_the_cache_by_residency(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setattr(la, "last_level_cache_bytes", lambda: 1024)  # Toy: 6 KiB of fp32 weights
    measure = Recorder(table())
    model = Toy()
    la.prepare_linear_weights(model, mode="auto", measure=measure)
    report = la.linear_backend_report(model)
    assert report["machine"] == la.machine_key("streamed")
    machines = json.loads(Path(report["cache_file"]).read_text())["machines"]
    assert list(machines) == [la.machine_key("streamed")]


# ------------------------------------------------------------------ forcing
def test_mode_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lb.mode_from_env() == "auto"
    monkeypatch.setenv(lb.BACKEND_ENV, "oneDNN")
    assert lb.mode_from_env() == "onednn"
    monkeypatch.setenv(lb.BACKEND_ENV, "blas")
    with pytest.raises(ValueError, match=r"WORKBENCH_CPU_LINEAR_BACKEND \('blas'\) must be "
                                         r"one of auto \| torch \| mkl \| onednn"):
        lb.mode_from_env()
    monkeypatch.setenv(lb.BACKEND_ENV, "auto")
    monkeypatch.setenv(lb.LEGACY_PACKED_ENV, "0")
    assert lb.mode_from_env() == "torch"
    monkeypatch.setenv(lb.BACKEND_ENV, "mkl")
    with pytest.raises(ValueError, match="WORKBENCH_CPU_PACKED_GEMM=0 turns packing off"):
        lb.mode_from_env()


def test_forcing_an_unavailable_backend_is_a_named_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = lb.unavailable_reason
    monkeypatch.setattr(lb, "unavailable_reason", lambda b: "no oneDNN here"
                        if b == "onednn" else real(b))
    with pytest.raises(ValueError, match="linear backend 'onednn' was forced .* no oneDNN here"):
        la.prepare_linear_weights(Toy(), mode="onednn")
    with pytest.raises(ValueError, match=r"mode \('fast'\) must be one of"):
        la.prepare_linear_weights(Toy(), mode="fast")


class Toy(nn.Module):
    """Two packable layers of one shape, one of another, a quantized one, a bf16 one."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for shape, dtype, quant in [((32, 16), torch.float32, None), ((32, 16), torch.float32,
                                    None), ((16, 32), torch.float32, None),
                                    ((16, 16), torch.float32, "int8"),
                                    ((8, 16), torch.bfloat16, None)]:
            m = nn.Module()
            m.weight = nn.Parameter(torch.randn(shape, dtype=dtype), requires_grad=False)
            m.packed_weight = None
            m.quant_method = quant
            self.layers.append(m)


@pytest.mark.parametrize("mode", AVAILABLE)
def test_forced_mode_plans_and_packs_every_fp32_layer(mode: str) -> None:
    model = Toy()
    total = la.prepare_linear_weights(model, mode=mode)
    a, b, c, q, half = model.layers
    for m in (a, b, c):
        assert m.linear_plan == LinearPlan.uniform(tuple(m.weight.shape), mode)
        assert (m.packed_weight is None) == (mode == "torch")
    assert not hasattr(q, "linear_plan") and half.linear_plan is None
    assert half.packed_weight is None
    assert total == (0 if mode == "torch" else 3 * 32 * 16 * 4)
    report = la.linear_backend_report(model)
    assert report["source"] == "forced" and report["cache_file"] is None
    assert report["shapes"] == {"32x16": f"1.. {mode} (forced)", "16x32": f"1.. {mode} (forced)"}


def test_auto_without_a_packed_backend_measures_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb, "available_backends", lambda: ("torch",))
    measure = Recorder(table())
    model = Toy()
    assert la.prepare_linear_weights(model, mode="auto", measure=measure) == 0
    assert measure.calls == []
    assert model.layers[0].linear_plan == LinearPlan.uniform((32, 16), "torch", "only torch")
    assert la.linear_backend_report(model)["source"] == "only torch"


def test_auto_mode_uses_the_injected_measurement(tmp_path: Path) -> None:
    model = Toy()
    measure = Recorder(table(p1=(10, 9, 11), p64=(10, 12, 12)))
    cache = TimingCache(tmp_path / "c.json", key="k")
    total = la.prepare_linear_weights(model, mode="auto", measure=measure, cache=cache)
    backends = tuple(b for b in ALL if b in AVAILABLE)
    assert [c[0] for c in measure.calls] == [(32, 16), (16, 32)]
    a = model.layers[0]
    if "mkl" in AVAILABLE:
        assert a.linear_plan.backends == ("mkl", "mkl", "torch", "torch", "torch")
        assert total == 3 * 32 * 16 * 4 and a.packed_weight is not None
    assert measure.calls[0][2] == list(backends)
    assert la.linear_backend_report(model)["source"] == "measured"
    la.prepare_linear_weights(model, mode="auto", measure=measure, cache=cache)
    assert len(measure.calls) == 2
    report = la.linear_backend_report(model)
    assert report["source"] == "cache" and report["autotune_s"] == 0.0


# ------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def llama_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]],
                                                                        list[list[int]]]:
    from tests.engine.conftest import NUM_OUTPUT, hf_greedy, mixed_prompts
    from workbench.testing import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", arch="llama", seed=0)
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    prompts = mixed_prompts(vocab)
    return ckpt, prompts, hf_greedy(ckpt, prompts, NUM_OUTPUT)


@pytest.mark.parametrize("backend", AVAILABLE)
def test_forced_backend_keeps_transformers_greedy_tokens(
        backend: str, monkeypatch: pytest.MonkeyPatch,
        llama_reference: tuple[Path, list[list[int]], list[list[int]]]) -> None:
    from tests.engine.conftest import NUM_OUTPUT
    from workbench import LLM, SamplingParams

    ckpt, prompts, expected = llama_reference
    monkeypatch.setenv(lb.BACKEND_ENV, backend)
    # chunks of 16 tokens and 10 decodes: buckets 4..31 and 1..3 / 4..31 both run
    llm = LLM(ckpt, dtype="float32", max_model_len=128, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=8)
    report = llm.memory_readout()["linear_backends"]
    assert report["source"] == "forced"
    assert set(report["shapes"].values()) == {f"1.. {backend} (forced)"}
    params = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    # one batch: the first step prefills all 374 prompt tokens (bucket 128..511)
    whole = LLM(ckpt, dtype="float32", max_model_len=128, block_size=4)
    outs = whole.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_engine_autotunes_once_then_reads_the_cache(
        tmp_path: Path, llama_reference: tuple[Path, list[list[int]], list[list[int]]]) -> None:
    from workbench import LLM

    ckpt = llama_reference[0]
    first = LLM(ckpt, dtype="float32", max_model_len=128).memory_readout()["linear_backends"]
    assert first["source"] == "measured" and first["autotune_s"] > 0
    assert Path(first["cache_file"]) == tmp_path / "cache" / la.CACHE_FILE
    second = LLM(ckpt, dtype="float32", max_model_len=128).memory_readout()["linear_backends"]
    assert second["source"] == "cache" and second["autotune_s"] == 0.0
    assert {s: v.replace("(cache)", "") for s, v in second["shapes"].items()} == {
        s: v.replace("(measured)", "") for s, v in first["shapes"].items()}

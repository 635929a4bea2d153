"""The OffloadingConnector end to end on a tiny Llama (fp32, CPU): a device pool too small to
keep six 65-token documents, a host tier that does; greedy tokens identical with every tier
on or off, after eviction and reload, across two engine instances sharing a disk tier, when
the disk tier dies or serves bad files, and under swap preemption; exact counters."""

from __future__ import annotations

import json
import random
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM
from workbench.core.request import RequestStatus
from workbench.sampling_params import SamplingParams
from workbench.testing import tiny_checkpoint

BLOCK = 4  # device block size (tokens)
OFFLOAD_BLOCK = 8  # the connector's block: 2 device blocks
DOC_LEN, TAIL = 60, 5  # prompt = a document + a 5-token question: 65 tokens
NUM_DOCS = 6
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("kvt") / "llama", arch="llama", seed=0)


@pytest.fixture(scope="module")
def prompts(ckpt: Path) -> list[list[int]]:
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    docs = [[rng.randrange(10, vocab) for _ in range(DOC_LEN)] for _ in range(NUM_DOCS)]
    return [d + [rng.randrange(10, vocab) for _ in range(TAIL)] for d in docs]


def offloading(**extra: Any) -> dict[str, Any]:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 22,
                                          "block_size": OFFLOAD_BLOCK, **extra}}


def engine(ckpt: Path, blocks: int = 40, **kw: Any) -> LLM:
    return LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=blocks, max_num_seqs=2,
               max_num_batched_tokens=64, max_model_len=128, **kw)


def one_by_one(llm: LLM, prompts: list[list[int]],
               params: SamplingParams = GREEDY) -> list[list[int]]:
    """Each prompt alone, in order: by the time a document comes back, the 40-block device
    pool (160 tokens) has evicted it (five other 73-token requests ran since)."""
    return [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in prompts]


@pytest.fixture(scope="module")
def reference(ckpt: Path, prompts: list[list[int]]) -> list[list[int]]:
    llm = engine(ckpt)
    out = one_by_one(llm, prompts + prompts)
    assert llm.stats()["vllm:prefix_cache_hits"] == 0  # the device pool kept nothing
    return out


def test_host_tier_reloads_evicted_prefixes_exactly(ckpt: Path, prompts: list[list[int]],
                                                    reference: list[list[int]]) -> None:
    llm = engine(ckpt, kv_transfer_config=offloading())
    assert one_by_one(llm, prompts + prompts) == reference
    st = llm.stats()
    # second round: each 65-token prompt loads (65 - 1) // 8 = 8 offloaded blocks = 64 tokens
    assert st["vllm:external_prefix_cache_hits"] == NUM_DOCS * 64
    assert st["workbench:kv_offload_host_hits"] == NUM_DOCS * 64
    assert st["vllm:external_prefix_cache_queries"] == 2 * NUM_DOCS * (DOC_LEN + TAIL)
    bpb = llm.engine.bytes_per_block
    assert st["vllm:kv_offload_load_bytes"] == NUM_DOCS * 64 // BLOCK * bpb
    # every full 8-token block of prompt + output (72 of 73 tokens) stored once: round two's
    # blocks are already there
    assert st["vllm:kv_offload_store_bytes"] == NUM_DOCS * (72 // BLOCK) * bpb
    assert st["workbench:kv_offload_failed_loads"] == 0
    assert list(llm.errors()) == []
    outs = llm.generate(prompts[:1], GREEDY)
    assert outs[0].num_cached_tokens == 64  # usage.prompt_tokens_details.cached_tokens


def test_the_loaded_kv_is_what_the_request_reads(ckpt: Path, prompts: list[list[int]],
                                                 reference: list[list[int]]) -> None:
    """Noise written over the host tier between the rounds changes round two's tokens: the
    equality above is the loaded KV's, not a recompute's."""
    llm = engine(ckpt, kv_transfer_config=offloading())
    assert one_by_one(llm, prompts) == reference[:NUM_DOCS]
    pool = llm.engine.runner.kv_connector.pool
    pool.host.normal_(0.0, 50.0)
    assert one_by_one(llm, prompts) != reference[NUM_DOCS:]


def test_max_load_tokens_caps_the_load(ckpt: Path, prompts: list[list[int]],
                                       reference: list[list[int]]) -> None:
    llm = engine(ckpt, kv_transfer_config=offloading())
    one_by_one(llm, prompts)
    capped = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                            extra_args={"kv_transfer_params": {"max_load_tokens": 22}})
    before = llm.stats()["vllm:external_prefix_cache_hits"]
    assert one_by_one(llm, prompts, capped) == reference[NUM_DOCS:]
    # 22 tokens, down to a device block boundary: 20 per request
    assert llm.stats()["vllm:external_prefix_cache_hits"] - before == NUM_DOCS * 20


def test_a_loading_request_waits_without_blocking_the_step(ckpt: Path,
                                                           prompts: list[list[int]]) -> None:
    llm = engine(ckpt, kv_transfer_config=offloading())
    one_by_one(llm, prompts)  # all six offloaded; the device pool holds the last ones only
    eng = llm.engine
    req = eng.make_request(prompts[0], GREEDY)
    eng.add_request(req)
    eng.step()  # admitted: blocks for 64 loaded tokens, load started; nothing scheduled
    assert eng.stats.step_trace[-1].prefill_tokens == 0
    assert req.output_token_ids == []
    # the step had nothing else to run, so it waited for the load: done, now running
    assert (req.status, req.num_computed_tokens) in (
        (RequestStatus.WAITING_FOR_REMOTE_KVS, 0), (RequestStatus.RUNNING, 64))
    steps = 1
    while not req.output_token_ids and steps < 50:
        eng.step()
        steps += 1
    assert req.num_computed_tokens == DOC_LEN + TAIL  # 64 loaded + the last one computed
    assert req.num_cached_tokens == 64
    while eng.has_unfinished_requests():
        eng.step()
    eng.scheduler.kv_cache_manager.check_integrity()


def gate_loads(llm: LLM) -> threading.Event:
    """Hold every load on the loader thread until the returned event is set."""
    pool = llm.engine.runner.kv_connector.pool
    real, gate = pool.load, threading.Event()

    def held(*args: Any, **kwargs: Any) -> None:
        assert gate.wait(30)
        real(*args, **kwargs)

    pool.load = held
    return gate


def test_abort_while_loading_frees_after_the_load(ckpt: Path, prompts: list[list[int]]) -> None:
    llm = engine(ckpt, kv_transfer_config=offloading())
    one_by_one(llm, prompts)
    eng = llm.engine
    kv = eng.scheduler.kv_cache_manager
    gate = gate_loads(llm)
    other = eng.make_request(list(range(20, 40)), SamplingParams(temperature=0, max_tokens=20,
                                                                 ignore_eos=True))
    eng.add_request(other)
    eng.step()  # `other` runs: the next step is not empty, so it waits for no load
    req = eng.make_request(prompts[0], GREEDY)
    eng.add_request(req)
    eng.step()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    eng.abort_request([req.request_id])
    assert req.status == RequestStatus.FINISHED_ABORTED
    held = kv.get_block_ids(req.request_id)
    assert len(held) == 64 // BLOCK  # still held: the load may be writing them
    eng.step()
    assert kv.get_block_ids(req.request_id) == held
    gate.set()
    for _ in range(40):
        if not eng.scheduler.loading:
            break
        eng.step()
    assert not eng.scheduler.loading and kv.get_block_ids(req.request_id) == []
    while eng.has_unfinished_requests():
        eng.step()
    kv.check_integrity()
    assert kv.num_free_blocks == 39  # everything back (block 0 is the null block)


def test_a_load_that_times_out_recomputes_on_other_blocks(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    llm = engine(ckpt, kv_transfer_config=offloading(load_timeout_s=0.2))
    one_by_one(llm, prompts)
    gate = gate_loads(llm)
    eng = llm.engine
    kv = eng.scheduler.kv_cache_manager
    req = eng.make_request(prompts[0], GREEDY)
    eng.add_request(req)
    eng.step()  # admitted; the empty step waits 0.2 s for the load, which is held: timed out
    assert req.request_id in eng.scheduler._quarantine
    quarantined = [b.block_id for b in eng.scheduler._quarantine[req.request_id]]
    assert len(quarantined) == 64 // BLOCK
    while eng.has_unfinished_requests():
        eng.step()
        assert not set(quarantined) & set(kv.get_block_ids(req.request_id))
        kv.check_integrity()
    assert req.output_token_ids == reference[NUM_DOCS]  # recomputed, same tokens
    assert [e["scope"] for e in llm.errors()] == ["kv_transfer"]
    gate.set()
    llm.engine.runner.kv_connector._loader.submit(lambda: None).result()
    eng.step()  # the copy is over: its blocks are released
    assert not eng.scheduler._quarantine
    kv.check_integrity()
    assert llm.stats()["workbench:kv_offload_failed_loads"] == 1


def test_disk_tier_is_shared_by_two_instances(ckpt: Path, prompts: list[list[int]],
                                              reference: list[list[int]],
                                              tmp_path: Path) -> None:
    kt = offloading(spec_name="TieringOffloadingSpec", disk_path=str(tmp_path / "store"))
    a = engine(ckpt, kv_transfer_config=kt)
    assert one_by_one(a, prompts) == reference[:NUM_DOCS]
    a.engine.runner.kv_connector.flush()
    files = sorted((tmp_path / "store").rglob("*.kv"))
    assert len(files) == NUM_DOCS * (72 // OFFLOAD_BLOCK)  # 9 full 8-token blocks each
    b = engine(ckpt, kv_transfer_config=kt)  # a fresh instance: empty device and host tiers
    assert one_by_one(b, prompts) == reference[NUM_DOCS:]
    st = b.stats()
    assert st["workbench:kv_offload_disk_hits"] == NUM_DOCS * 64
    assert st["workbench:kv_offload_host_hits"] == 0
    # each of the 8 files a request loads holds one offloaded block (2 device blocks)
    assert st["vllm:kv_offload_tiering_read_bytes"] == NUM_DOCS * 8 * 2 * b.engine.bytes_per_block


def test_a_dead_or_corrupt_disk_tier_degrades_to_recompute(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]],
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    kt = offloading(spec_name="TieringOffloadingSpec", disk_path=str(store))
    a = engine(ckpt, kv_transfer_config=kt)
    one_by_one(a, prompts)
    a.engine.runner.kv_connector.flush()
    for f in store.rglob("*.kv"):  # every file cut short: each load fails, then recomputes
        f.write_bytes(f.read_bytes()[:100])
    b = engine(ckpt, kv_transfer_config=kt)
    assert one_by_one(b, prompts) == reference[NUM_DOCS:]
    st = b.stats()
    assert st["workbench:kv_offload_failed_loads"] == NUM_DOCS
    errors = list(b.errors())
    assert {e["scope"] for e in errors} == {"kv_transfer"}
    assert all("load for" in e["message"] for e in errors)
    b.engine.runner.kv_connector.flush()
    shutil.rmtree(store)  # the store is gone altogether: lookups miss, nothing fails
    c = engine(ckpt, kv_transfer_config=kt)
    assert one_by_one(c, prompts) == reference[NUM_DOCS:]
    assert c.stats()["vllm:external_prefix_cache_hits"] == 0
    assert list(c.errors()) == []


def test_swap_preemption_gives_the_recompute_tokens(ckpt: Path,
                                                    prompts: list[list[int]]) -> None:
    many = [p[:DOC_LEN] + [1, 2] for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)

    def batch(**kw: Any) -> tuple[list[list[int]], dict[str, Any]]:
        llm = LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=60, max_num_seqs=6,
                  max_num_batched_tokens=256, max_model_len=128, **kw)
        out = [list(o.outputs[0].token_ids) for o in llm.generate(many, params)]
        llm.engine.scheduler.kv_cache_manager.check_integrity()
        return out, llm.stats()

    recompute, st0 = batch()
    swapped, st1 = batch(kv_transfer_config=offloading(block_size=BLOCK),
                         preemption_mode="swap")
    assert swapped == recompute
    assert st0["vllm:num_preemptions"] > 0 and st1["vllm:num_preemptions"] > 0
    assert st1["workbench:kv_swap_out_blocks"] > 0
    assert st1["workbench:kv_swap_in_blocks"] > 0
    assert st1["workbench:kv_swap_fallbacks"] == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}},
     "kv_transfer_config kv_connector ('LMCacheConnectorV1') must be one of "
     "OffloadingConnector"),
    ({"kv_transfer_config": {"kv_connector": "OffloadingConnector"}},
     "kv_transfer_config kv_connector_extra_config needs cpu_bytes_to_use"),
    ({"kv_transfer_config": offloading(block_size=6)},
     "kv_transfer_config kv_connector_extra_config block_size (6) must be a multiple of "
     "block_size (4)"),
    ({"kv_transfer_config": offloading(spec_name="TieringOffloadingSpec")},
     "kv_transfer_config kv_connector_extra_config disk_path (None) is required"),
    ({"kv_transfer_config": offloading(spec_name="TieringOffloadingSpec", disk_path=__file__)},
     f"kv_transfer_config kv_connector_extra_config disk_path ({__file__!r}) is a file, not a "
     "folder; it must be a folder this process can create or write"),
    ({"kv_transfer_config": offloading(cpu_bytes=1)},
     "kv_transfer_config kv_connector_extra_config has unknown key(s) cpu_bytes"),
    ({"kv_transfer_config": {**offloading(), "kv_role": "kv_producer"}},
     "kv_transfer_config kv_role ('kv_producer') must be 'kv_both'"),
    ({"preemption_mode": "swap"}, "preemption_mode ('swap') needs a host KV tier"),
    ({"preemption_mode": "spill"}, "preemption_mode ('spill') must be one of recompute, swap"),
])
def test_bad_kv_transfer_config_is_refused_up_front(ckpt: Path, kwargs: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(ValueError) as e:
        engine(ckpt, **kwargs)
    assert str(e.value).startswith(message), str(e.value)


def test_bad_kv_transfer_params_are_refused(ckpt: Path) -> None:
    with pytest.raises(ValueError, match=r"kv_transfer_params max_load_tokens \(-1\) must be an "
                                         r"integer >= 0"):
        SamplingParams(extra_args={"kv_transfer_params": {"max_load_tokens": -1}})
    with pytest.raises(ValueError, match=r"kv_transfer_params has unknown key\(s\) do_remote"):
        SamplingParams(extra_args={"kv_transfer_params": {"do_remote": True}})


def test_disk_bytes_to_use_prunes_the_least_recently_used_files(
        ckpt: Path, prompts: list[list[int]], tmp_path: Path) -> None:
    store = tmp_path / "store"
    probe = engine(ckpt, kv_transfer_config=offloading(
        spec_name="TieringOffloadingSpec", disk_path=str(tmp_path / "probe")))
    one_by_one(probe, prompts[:1])
    probe.engine.runner.kv_connector.flush()
    size = next((tmp_path / "probe").rglob("*.kv")).stat().st_size  # one block's file
    cap = 20 * size
    llm = engine(ckpt, kv_transfer_config=offloading(
        spec_name="TieringOffloadingSpec", disk_path=str(store), disk_bytes_to_use=cap))
    one_by_one(llm, prompts)  # 6 x 9 = 54 blocks written through
    llm.engine.runner.kv_connector.flush()
    kept = sum(f.stat().st_size for f in store.rglob("*.kv"))
    assert 0 < kept <= cap


def test_loaded_requests_under_pool_pressure_all_finish(ckpt: Path, prompts: list[list[int]],
                                                        reference: list[list[int]]) -> None:
    """Six offloaded prompts at once into a 34-block pool (each loads 16 blocks): a loaded
    request joins the running ones (preemptable), so holders never starve each other."""
    llm = LLM(str(ckpt), block_size=BLOCK, num_gpu_blocks_override=34, max_num_seqs=6,
              max_num_batched_tokens=64, max_model_len=128, kv_transfer_config=offloading())
    one_by_one(llm, prompts)
    eng = llm.engine
    reqs = [eng.make_request(p, GREEDY) for p in prompts]
    for r in reqs:
        eng.add_request(r)
    for _ in range(400):
        if not eng.has_unfinished_requests():
            break
        eng.step()
        eng.scheduler.kv_cache_manager.check_integrity()
    assert not eng.has_unfinished_requests()
    assert [r.output_token_ids for r in reqs] == reference[NUM_DOCS:]
    assert llm.stats()["vllm:num_preemptions"] > 0


def test_reset_prefix_cache_with_reset_connector_empties_the_tiers(
        ckpt: Path, prompts: list[list[int]], tmp_path: Path) -> None:
    store = tmp_path / "store"
    llm = engine(ckpt, kv_transfer_config=offloading(spec_name="TieringOffloadingSpec",
                                                     disk_path=str(store)))
    one_by_one(llm, prompts)
    llm.engine.runner.kv_connector.flush()
    assert list(store.rglob("*.kv"))
    assert llm.reset_prefix_cache() is True  # the device cache only: the tiers keep theirs
    assert list(store.rglob("*.kv"))
    assert llm.reset_prefix_cache(reset_connector=True) is True
    assert list(store.rglob("*.kv")) == []
    assert llm.stats()["workbench:kv_offload_cpu_usage_perc"] > 0  # the gauge: last step
    before = llm.stats()["vllm:external_prefix_cache_hits"]
    one_by_one(llm, prompts)  # nothing to load: every tier was emptied
    assert llm.stats()["vllm:external_prefix_cache_hits"] == before


def test_a_store_killed_mid_load_degrades_to_recompute(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]],
        tmp_path: Path) -> None:
    """The disk tier dies between the lookup (files there) and the load (files gone): the
    load fails, the request recomputes, its tokens are the reference's; the step trace shows
    the request waiting for its KV and the bytes moved."""
    store = tmp_path / "store"
    kt = offloading(spec_name="TieringOffloadingSpec", disk_path=str(store))
    a = engine(ckpt, kv_transfer_config=kt)
    one_by_one(a, prompts)
    a.engine.runner.kv_connector.flush()
    b = engine(ckpt, kv_transfer_config=kt)
    gate = gate_loads(b)
    eng = b.engine
    req = eng.make_request(prompts[0], GREEDY)
    other = eng.make_request(list(range(20, 40)), SamplingParams(temperature=0, max_tokens=6,
                                                                 ignore_eos=True))
    eng.add_request(other)
    eng.add_request(req)
    eng.step()  # `other` runs; `req` found its 8 blocks on disk and waits for them
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert eng.stats.step_trace[-1].waiting_for_kv == 1
    b.engine.runner.kv_connector.flush()  # no write of `other`'s blocks in flight
    shutil.rmtree(store)  # the store dies
    gate.set()
    while eng.has_unfinished_requests():
        eng.step()
    assert req.output_token_ids == reference[NUM_DOCS]
    assert b.stats()["workbench:kv_offload_failed_loads"] == 1
    assert [e["scope"] for e in b.errors()] == ["kv_transfer"]
    trace = eng.stats.step_trace
    assert sum(r.kv_store_bytes for r in trace) == b.stats()["vllm:kv_offload_store_bytes"]
    eng.scheduler.kv_cache_manager.check_integrity()

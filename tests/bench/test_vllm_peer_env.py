"""vLLM peer environments: "best" preloads tcmalloc and libiomp5 or is refused naming what is
missing (never a silent "best" below its best); the result says which libraries the worker
really had mapped."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.bench.peers import vllm_peer


def fake_venv(tmp_path: Path, iomp: bool) -> Path:
    (tmp_path / "lib").mkdir()
    if iomp:
        (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    return tmp_path


def test_best_preloads_both_libraries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = fake_venv(tmp_path, iomp=True)
    monkeypatch.setattr(vllm_peer, "find_tcmalloc", lambda: "/x/libtcmalloc_minimal.so.4")
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    env = vllm_peer.worker_env("best", venv)
    assert env["LD_PRELOAD"] == f"/x/libtcmalloc_minimal.so.4:{venv}/lib/libiomp5.so"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    default = vllm_peer.worker_env("default", venv)
    assert "LD_PRELOAD" not in default and "VLLM_CPU_OMP_THREADS_BIND" not in default


@pytest.mark.parametrize(("tcmalloc", "iomp", "missing"), [
    (None, True, "missing: libtcmalloc_minimal.so.4 (apt-get install libtcmalloc-minimal4)."),
    ("/x/libtcmalloc_minimal.so.4", False, "libiomp5.so (pip install intel-openmp in"),
    (None, False, "libtcmalloc_minimal.so.4 (apt-get install libtcmalloc-minimal4); "),
])
def test_best_without_a_preload_library_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tcmalloc: str | None, iomp: bool,
        missing: str) -> None:
    venv = fake_venv(tmp_path, iomp)
    monkeypatch.setattr(vllm_peer, "find_tcmalloc", lambda: tcmalloc)
    with pytest.raises(FileNotFoundError) as e:
        vllm_peer.worker_env("best", venv)
    assert str(e.value).startswith("vllm-best needs tcmalloc and libiomp5 preloaded")
    assert missing in str(e.value) and str(e.value).endswith("Run `make peer-vllm`")
    vllm_peer.worker_env("default", venv)  # the default configuration needs neither


@pytest.mark.parametrize(("maps", "label"), [
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9\n/v/lib/libiomp5.so",
     "tcmalloc+iomp5"),
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9", "tcmalloc"),
    ("/v/lib/libiomp5.so", "iomp5"),
    ("", "none"),
])
def test_the_preload_label_is_what_was_mapped(maps: str, label: str) -> None:
    assert vllm_peer.mapped_preload(maps) == label


def test_a_bad_config_is_named() -> None:
    with pytest.raises(ValueError,
                       match=r"vLLM config \('fast'\) must be one of best, best-thp, default"):
        vllm_peer.worker_env("fast")


def test_best_thp_is_best_on_huge_pages_and_the_others_run_as_shipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.worker import hugepages

    venv = fake_venv(tmp_path, iomp=True)
    monkeypatch.setattr(vllm_peer, "find_tcmalloc", lambda: "/x/libtcmalloc_minimal.so.4")
    # THP_MEM_ALLOC_ENABLE=1 set by `import workbench` stays in this process
    monkeypatch.setattr(hugepages, "_auto_set", True)
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    thp = vllm_peer.worker_env("best-thp", venv)
    best = vllm_peer.worker_env("best", venv)
    assert thp["THP_MEM_ALLOC_ENABLE"] == "1"
    assert {k: v for k, v in thp.items() if k != "THP_MEM_ALLOC_ENABLE"} == best
    assert "THP_MEM_ALLOC_ENABLE" not in best
    assert "THP_MEM_ALLOC_ENABLE" not in vllm_peer.worker_env("default", venv)
    # one a user exported is passed on
    monkeypatch.setattr(hugepages, "_auto_set", False)
    assert vllm_peer.worker_env("default", venv)["THP_MEM_ALLOC_ENABLE"] == "1"

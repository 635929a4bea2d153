"""API fuzzing of the server with schemathesis, from the server's own /openapi.json.

Every operation of the schema is fuzzed with cases that fit the schema (positive) and cases
that break it (negative), against a real uvicorn server on the tiny checkpoint (max_model_len
32, so no generation is long). Checks on every answer: no 5xx (`not_a_server_error`), the
status is one the schema lists, the content type and the JSON body match the schema, and a
negative case is refused with a 4xx. A third mode, "hostile", takes positive bodies of the two
POST routes and plants what JSON can carry but no field may hold (a lone surrogate in one
string, Infinity / -Infinity / NaN in place of one number): the answer must be a 400 whose
`param` is exactly that value's path. Afterwards the server must be healthy, with nothing in
flight and the KV cache empty.

The whole suite runs twice: on a plain server, and on one with an API key and a KV connector
(OffloadingConnector with a CPU and a disk tier in a temporary folder), so neither the auth
middleware nor the connector's paths answer a case with a 5xx or off the schema. There every
case sends the key (the schema's security requirement is dropped from what the cases are
drawn from, else a negative case "without the required Authorization header" would still carry
it); refusals without the key are tests/server/test_auth_openapi.py's.

    .venv/bin/python -m pytest tests/server/test_schemathesis.py -q -s     # short: ~30 cases/op
    WORKBENCH_FUZZ_LONG=1 .venv/bin/python -m pytest tests/server/test_schemathesis.py -q -s
    WORKBENCH_FUZZ_SEED=123 ...   # the long run draws a random seed (printed) unless given one

The short run is derandomized (the same cases every time); `-s` prints the per-operation case
counts and status codes (docs/reliability-server.md records them).
"""

from __future__ import annotations

import collections
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import MODEL_NAME, ServerHandle, start_server, stop_server
from workbench.config import EngineConfig
from workbench.server.app import build_app

LONG = os.environ.get("WORKBENCH_FUZZ_LONG") == "1"
# cases per (operation, mode); an operation without parameters has one distinct case
EXAMPLES = 400 if LONG else 30
FUZZ_ENGINE_KW: dict[str, Any] = dict(
    dtype="float32", max_model_len=32, block_size=16, num_gpu_blocks_override=256,
    max_num_seqs=64,
)
TIMEOUT_S = 60  # per case; the slowest case (64 prompts x n 16 x 31 tokens) takes seconds
OPERATIONS = {
    "POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /health",
    "GET /metrics", "POST /reset_prefix_cache", "GET /kv_transfer_info",
}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection]


@dataclass
class Tally:
    cases: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    params: collections.Counter[str] = field(default_factory=collections.Counter)  # of 400s
    examples: dict[str, str] = field(default_factory=dict)  # param -> one 400 message
    failures: list[str] = field(default_factory=list)

    def record(self, status: int, body: bytes) -> None:
        self.cases += 1
        self.statuses[status] += 1
        if status == 400:
            err = json.loads(body)["error"]
            param = str(err["param"]).split(".")[0]
            self.params[param] += 1
            self.examples.setdefault(param, err["message"])

    @property
    def passed(self) -> int:
        return self.cases - len(self.failures)


API_KEY = "fuzz-key-0123"


@dataclass
class Fuzzed:
    handle: ServerHandle
    headers: dict[str, str]  # sent with every case (the API key, if any)


@pytest.fixture(scope="module", params=["plain", "key+kv"])
def fuzz_server(model_dir: Path, request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    kw: dict[str, Any] = dict(FUZZ_ENGINE_KW)
    api_key, headers = None, {}
    if request.param == "key+kv":
        disk = tmp_path_factory.mktemp("kv_disk_tier")
        kw["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20, "disk_path": str(disk),
                                          "spec_name": "TieringOffloadingSpec"}}
        api_key, headers = API_KEY, {"Authorization": f"Bearer {API_KEY}"}
    config = EngineConfig.from_kwargs(str(model_dir), **kw)
    handle = start_server(build_app(config, served_model_name=MODEL_NAME, api_key=api_key))
    yield Fuzzed(handle, headers)
    stop_server(handle)


def _fuzz(op: Any, mode: GenerationMode, base_url: str, session: requests.Session,
          seed: int | None) -> Tally:
    """Cases of `op` in `mode`; `session` carries the API key, if any. (The derandomized
    cases follow `run`'s source: edit it and the short run's cases change.)"""
    tally = Tally()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=seed is None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        try:
            response = case.call(base_url=base_url, session=session, timeout=TIMEOUT_S)
        except requests.RequestException as e:  # no answer (a hang is a failure too)
            tally.cases += 1
            tally.failures.append(f"{op.label} [{mode.value}]: {type(e).__name__}: {e}\n"
                                  f"{case.as_curl_command()}"[:3000])
            return
        tally.record(response.status_code, response.content)
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as e:  # noqa: BLE001 - collected, reported all together below
            tally.failures.append(f"{op.label} [{mode.value}]: {e}"[:3000])

    if seed is not None:
        run = hypothesis_seed(seed)(run)
    run()
    return tally


def _leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, value) of every string and (non-bool) number in a JSON value."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, str(i)))]
    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return [(path, value)]
    return []


def _plant(body: Any, path: tuple[str, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(body, list):
        i = int(head)
        return [*body[:i], _plant(body[i], rest, new), *body[i + 1:]]
    return {**body, head: _plant(body[head], rest, new)}


def _fuzz_hostile(op: Any, base_url: str, session: requests.Session, seed: int | None) -> Tally:
    """Positive bodies with one planted lone surrogate or non-finite number: a 400 naming it."""
    tally = Tally()
    path_ = op.path

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=seed is None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        leaves = _leaves(case.body)
        if not leaves:
            return
        where, value = data.draw(st.sampled_from(leaves))
        if isinstance(value, str):
            at = data.draw(st.integers(0, len(value)))
            lone = chr(data.draw(st.integers(0xD800, 0xDFFF)))
            new: Any = value[:at] + lone + value[at:]
        else:
            new = data.draw(st.sampled_from([float("inf"), float("-inf"), float("nan")]))
        raw = json.dumps(_plant(case.body, where, new))  # ensure_ascii: \udXXX, Infinity
        response = session.post(base_url + path_, data=raw.encode(), timeout=TIMEOUT_S,
                                headers={"content-type": "application/json"})
        tally.record(response.status_code, response.content)
        expected = ".".join(where)
        ok = response.status_code == 400 and response.json()["error"]["param"] == expected
        if not ok:
            tally.failures.append(f"{op.label} [hostile]: planted {new!a} at {expected!r}: "
                                  f"{response.status_code} {response.text[:500]}")

    if seed is not None:
        run = hypothesis_seed(seed)(run)
    run()
    return tally


def _report(tallies: dict[tuple[str, str], Tally], seed: int | None, wall_s: float) -> str:
    lines = [f"schemathesis {schemathesis.__version__}: {EXAMPLES} examples per operation "
             f"and mode ({'long' if LONG else 'short'} run, seed "
             f"{'derandomized' if seed is None else seed}), {wall_s:.0f} s"]
    for (label, mode), t in sorted(tallies.items()):
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(t.statuses.items()))
        lines.append(f"  {label:28s} {mode:8s} cases {t.cases:4d}  passed {t.passed:4d}  "
                     f"[{codes}]")
        if t.params:
            top = ", ".join(f"{p} {n}" for p, n in t.params.most_common(6))
            lines.append(f"  {'':28s} {'':8s} 400s by field: {top}")
            if mode == "positive":  # schema-valid but refused: what the schema cannot say
                lines.extend(f"  {'':37s} e.g. {t.examples[p][:110]!a}"
                             for p, _ in t.params.most_common(6))
    total = sum(t.cases for t in tallies.values())
    passed = sum(t.passed for t in tallies.values())
    lines.append(f"  total: {total} cases, {passed} passed")
    return "\n".join(lines)


def test_fuzz_every_operation_from_the_openapi_schema(fuzz_server: Fuzzed) -> None:
    server, auth = fuzz_server.handle, fuzz_server.headers
    url = server.base_url
    if auth:  # every case carries the key: the requirement is dropped from the cases' schema
        doc = httpx.get(f"{url}/openapi.json", headers=auth, timeout=30).json()  # (401s:
        for item in doc["paths"].values():                      # test_auth_openapi.py)
            for op in item.values():
                op.pop("security", None)
        schema = schemathesis.openapi.from_dict(doc)
    else:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ops = {op.label: op for op in (r.ok() for r in schema.get_all_operations())}
    assert set(ops) == OPERATIONS
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED", random.randrange(1 << 32))) if LONG \
        else None
    tallies: dict[tuple[str, str], Tally] = {}
    t0 = time.perf_counter()
    with requests.Session() as session:
        session.headers.update(auth)  # every case sends the key
        for label in sorted(ops):
            op = ops[label]
            has_input = bool(op.body) or any(True for _ in op.iter_parameters())
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                if mode is GenerationMode.NEGATIVE and not has_input:
                    continue  # nothing to break
                tallies[(label, mode.value)] = _fuzz(op, mode, url, session, seed)
            if op.method.upper() == "POST" and op.body:
                tallies[(label, "hostile")] = _fuzz_hostile(op, url, session, seed)
    print("\n" + _report(tallies, seed, time.perf_counter() - t0))

    failures = [f for t in tallies.values() for f in t.failures]
    assert not failures, f"{len(failures)} failing cases; the first ones:\n" + "\n\n".join(
        failures[:5])
    for label in ("POST /v1/completions", "POST /v1/chat/completions"):
        pos = tallies[(label, "positive")]
        # The fuzz must reach generation, not only refusals. Which cases the derandomized run
        # draws still depends on the process's earlier state (schemathesis' and hypothesis'
        # caches): 6 to 12 of 30 chat cases were 200s alone, in tests/server/ and in the
        # suite, so the bound is a floor for "reaches the success path", not a share.
        assert pos.cases >= min(EXAMPLES, 20) and pos.statuses[200] >= 3, pos
        neg = tallies[(label, "negative")]
        assert neg.cases >= min(EXAMPLES, 20) and neg.statuses[200] == 0, neg
        hostile = tallies[(label, "hostile")]
        assert hostile.cases >= min(EXAMPLES, 20) and set(hostile.statuses) == {400}, hostile
    # the server is healthy and idle afterwards: nothing in flight, every KV block free
    assert all(401 not in t.statuses for t in tallies.values())  # the key got every case in
    assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ready"}
    server.wait_idle(timeout_s=30)
    usage = server.engine.submit(lambda e: e.scheduler.kv_cache_manager.usage)
    assert usage.result(timeout=30) == 0.0
    metrics = server.metrics()
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    if auth:  # the connector took part: the disk tier wrote KV, and no file was bad
        written = [v for k, v in metrics.items()
                   if k.startswith("workbench:kv_offload_tiering_write_bytes")]
        assert written and max(written) > 0, sorted(metrics)
        assert all(v == 0 for k, v in metrics.items()
                   if k.startswith(("workbench:kv_offload_tiering_bad_files",
                                    "workbench:kv_offload_tiering_failed_writes")))

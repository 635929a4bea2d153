"""Server-side numbers from a Prometheus `/metrics` endpoint (vLLM, SGLang, `workbench serve`).

Place in the flow: the HTTP target scrapes `/metrics` right before and right after each
measured run (`Target.server_snapshot`, a flat dict) and a `Poller` scrapes it every
`interval_s` during the run (a time series of running / waiting / KV usage). `delta` turns a
before/after pair into what the run itself did, the way a careful lab report reads vLLM:

    counters (`*_total`)         after - before (a counter that went down was reset: after)
    histograms (`_sum`/`_count`) the same deltas, and `NAME:mean_delta` = Δsum / Δcount, the
                                 server-side mean of exactly the requests of this run
    gauges                       not differenced (a level, not an amount): use the Poller

Always take a fresh `before` per run, never the previous run's `after`: requests sent in
between then show up in Δcount (`check_request_count`).

Flat keys: the sample name, plus the labels that are not identity labels (`model_name`,
`engine`) as `name{k="v"}`; samples of other models are dropped when `model` is given, and
series that differ only by identity labels (e.g. data-parallel engines) are summed, except
usage ratios (`*_perc`, `*usage*`), which are averaged. `_created` samples (counter creation
timestamps) and histogram buckets are left out unless `buckets=True`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

IDENTITY_LABELS = ("model_name", "engine")
COUNTER_SUFFIXES = ("_total", "_sum", "_count", "_bucket")
# Poller row field -> metric names that mean it (vLLM first, then older vLLM, then SGLang).
SERIES_METRICS: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_cache_usage_perc": (
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"
    ),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "generation_tokens_total": (
        "vllm:generation_tokens_total", "sglang:generation_tokens_total"
    ),
    "num_preemptions_total": ("vllm:num_preemptions_total",),
}
E2E_HISTOGRAM = "vllm:e2e_request_latency_seconds"


# --------------------------------------------------------------------------- parse / scrape
def _is_ratio(name: str) -> bool:
    return name.endswith("_perc") or "usage" in name


def _key(name: str, labels: dict[str, str]) -> str:
    rest = sorted((k, v) for k, v in labels.items() if k not in IDENTITY_LABELS)
    if not rest:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in rest) + "}"


def parse(text: str, model: str | None = None, buckets: bool = False) -> dict[str, float]:
    """Prometheus text exposition -> {flat key: value} (see the module docstring)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created") or s.name.endswith("_gcount"):
                continue
            if s.name.endswith("_bucket") and not buckets:
                continue
            if model is not None and s.labels.get("model_name", model) != model:
                continue
            key = _key(s.name, s.labels)
            sums[key] = sums.get(key, 0.0) + float(s.value)
            counts[key] = counts.get(key, 0) + 1
    return {k: (v / counts[k] if _is_ratio(k.split("{")[0]) else v) for k, v in sums.items()}


def metrics_url(base_url: str) -> str:
    """http://HOST:PORT/v1 -> http://HOST:PORT/metrics (the server root, as vLLM serves it)."""
    return root_url(base_url) + "/metrics"


def root_url(base_url: str) -> str:
    """The server root of an OpenAI base URL: a trailing /v1 (and slash) removed."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def scrape(
    url: str, model: str | None = None, timeout_s: float = 5.0, buckets: bool = False,
    client: httpx.Client | None = None,
) -> dict[str, float]:
    """GET a /metrics URL and parse it; raises httpx.HTTPError when it cannot be read."""
    if client is not None:
        resp = client.get(url, timeout=timeout_s)
    else:
        resp = httpx.get(url, timeout=timeout_s, trust_env=False)
    resp.raise_for_status()
    return parse(resp.text, model=model, buckets=buckets)


async def ascrape(
    client: httpx.AsyncClient, url: str, model: str | None = None, timeout_s: float = 5.0
) -> dict[str, float]:
    """`scrape` on an asyncio loop."""
    resp = await client.get(url, timeout=timeout_s)
    resp.raise_for_status()
    return parse(resp.text, model=model)


# --------------------------------------------------------------------------- deltas
def _is_counter(key: str) -> bool:
    return key.split("{")[0].endswith(COUNTER_SUFFIXES)


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What happened between two snapshots: counter deltas, histogram means, hit rates."""
    out: dict[str, float] = {}
    if not before or not after:
        return out  # a snapshot is missing (scrape failed): no deltas rather than totals
    for key, a in after.items():
        b = before.get(key)
        if not _is_counter(key) or not isinstance(a, int | float):
            continue
        if not isinstance(b, int | float):
            b = 0.0  # a series that appeared during the run started from zero
        out[key] = float(a - b) if a >= b else float(a)  # went down: the counter was reset
    for key in list(out):
        name, brace, labels = key.partition("{")
        if name.endswith("_sum"):
            base = name[: -len("_sum")]
            n = out.get(f"{base}_count{brace}{labels}")
            if n:
                out[f"{base}:mean_delta{brace}{labels}"] = out[key] / n
    for hits, queries, name in (
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
         "vllm:prefix_cache_hit_rate:delta"),
        ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
         "vllm:spec_decode_acceptance_rate:delta"),
    ):
        if out.get(queries):
            out[name] = out.get(hits, 0.0) / out[queries]
    return out


def check_request_count(
    d: dict[str, float], expected: int, histogram: str = E2E_HISTOGRAM
) -> str | None:
    """None when the run's Δcount of `histogram` equals `expected` requests, else why not
    (other traffic reached the server, or it did not record every request)."""
    got = d.get(histogram + "_count")
    if got is None:
        return f"{histogram}_count not exposed: cannot check the request count"
    if int(round(got)) != expected:
        return (f"{histogram} Δcount = {got:g} but {expected} requests were measured: other "
                "requests reached the server during the run, or it did not finish them all")
    return None


def mlflow_safe(d: dict[str, float], prefix: str = "server.") -> dict[str, float]:
    """Keys MLflow accepts: `name{k="v"}` -> `name.k.v` (":" is mapped by the Store)."""
    out = {}
    for key, v in d.items():
        name, _, labels = key.partition("{")
        parts = [p.replace('"', "").replace("=", ".") for p in labels.rstrip("}").split(",") if p]
        out[prefix + ".".join([name, *parts]).replace("+", "plus")] = v
    return out


def series_row(snapshot: dict[str, float]) -> dict[str, float]:
    """The Poller's fields from one snapshot (first metric name that the server exposes)."""
    row = {}
    for field, names in SERIES_METRICS.items():
        for name in names:
            if name in snapshot:
                row[field] = snapshot[name]
                break
    return row


def series_from_text(text: str, model: str | None = None) -> dict[str, float]:
    """`series_row(parse(text))` without the full parser: a line scan for the few
    SERIES_METRICS names, cheap enough to run every second beside the load generator."""
    names = {n: field for field, ns in SERIES_METRICS.items() for n in ns}
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace, space = line.find("{"), line.find(" ")
        cut = brace if 0 <= brace < space or space < 0 else space
        if cut < 0 or line[:cut] not in names:
            continue
        name = line[:cut]
        if model is not None and "model_name=" in line and f'model_name="{model}"' not in line:
            continue
        if 'replica="' in line:  # `workbench router`: per-replica copies of its aggregate
            continue
        rest = line.rsplit("}", 1)[1] if brace == cut else line[cut:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    flat = {n: (v / counts[n] if _is_ratio(n) else v) for n, v in sums.items()}
    return series_row(flat)


# --------------------------------------------------------------------------- poller
class Poller:
    """Scrapes `url` every `interval_s` on the running asyncio loop while started.

    Each row: {"step", "t_s" (since `t0`), "wall_time_s" (perf_counter), "running",
    "waiting", "kv_cache_usage_perc", token counters...}. A failed scrape is counted in
    `errors` (and logged once); polling goes on. Ticks are on a fixed grid from the start, so a
    slow scrape does not shift the later ones.
    """

    def __init__(
        self, url: str, interval_s: float = 1.0, model: str | None = None,
        t0: float | None = None, client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"Poller interval_s ({interval_s}) must be > 0 seconds")
        self.url, self.interval_s, self.model = url, interval_s, model
        self.clock = clock
        self.t0 = clock() if t0 is None else t0
        self.rows: list[dict[str, float]] = []
        self.errors = 0
        self.last_error: str | None = None
        self._client = client
        self._own_client = client is None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> Poller:
        """Start polling on the current loop (call from a coroutine)."""
        if self.running:
            return self
        if self._client is None or self._own_client:
            self._client = httpx.AsyncClient(trust_env=False)
            self._own_client = True
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def stop(self) -> list[dict[str, float]]:
        """Stop polling (one last scrape first) and return the rows."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await self.poll_once()
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None
        return self.rows

    async def __aenter__(self) -> Poller:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def poll_once(self) -> dict[str, float] | None:
        if self._client is None:
            return None
        wall = self.clock()
        try:
            resp = await self._client.get(self.url, timeout=max(self.interval_s, 1.0))
            resp.raise_for_status()
            values = series_from_text(resp.text, self.model)
        except (httpx.HTTPError, ValueError) as e:
            self.errors += 1
            if self.last_error is None:
                logger.warning("scraping %s failed (%s); the poller goes on", self.url, e)
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        row = {"step": len(self.rows), "t_s": wall - self.t0, "wall_time_s": wall, **values}
        self.rows.append(row)
        return row

    async def _loop(self) -> None:
        start = self.clock()
        k = 0
        while True:
            await self.poll_once()
            k += 1
            delay = start + k * self.interval_s - self.clock()
            if delay < 0:  # fell behind: skip the missed ticks
                k += int(-delay // self.interval_s) + 1
                delay = start + k * self.interval_s - self.clock()
            await asyncio.sleep(delay)

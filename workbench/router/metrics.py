"""The router's `/metrics`: its own counters, every replica's metrics, and their aggregates.

Place in the flow: on each scrape, `app` fetches every live replica's /metrics
(`Replica.last_metrics` keeps the last good text, so a dead replica's counters stay frozen
instead of vanishing) and renders `RouterCollector`:

    router_requests_total{replica}          attempts sent to the replica (retries included)
    router_requests_outstanding{replica}    attempts in flight now
    router_retries_total{replica}           attempts on it that failed and went elsewhere
    router_replica_failures_total{replica}  times the replica was marked dead
    router_replica_restarts_total{replica}  times it came back after a restart (Ray pool)
    router_replica_up{replica}              1 alive, 0 dead
    router_client_requests_total, router_failed_requests_total (no replica could finish),
    router_resumed_streams_total, router_restarted_requests_total,
    router_routing_decisions_total{reason}  the policy's reasons (owner, load_bound, ...)
    router_info{policy,num_replicas,prefix_blocks,block_size} 1

    vllm:*{..., replica="i"}                each replica's own series, a `replica` label added
    vllm:*{...}                             the aggregate over replicas: the sum, except usage
                                            ratios (`*_perc`, `*usage*`: the mean) and `*_info`
                                            gauges (the max)

Disaggregated (`disagg.DisaggRouter`), also:

    workbench:disagg_prefill_requests_total{replica}   prefill attempts sent to the replica
    workbench:disagg_prefill_retries_total             failed prefill attempts retried on
                                                       another prefill replica
    workbench:disagg_prefill_fallbacks_total           requests prefilled by the decode replica
                                                       (no prefill replica could)
    workbench:disagg_prefill_no_params_total           prefills answered with null params
    workbench:disagg_prefill_seconds                   histogram: prefill leg, retries included
    workbench:disagg_decode_first_byte_seconds         histogram: decode leg to its first byte
    workbench:disagg_info{prefill_policy,decode_policy,num_prefill,num_decode} 1

(`router_routing_decisions_total` then counts both legs' decisions.) The unlabelled aggregate
of a request-level family (histograms, `vllm:request_success`) then sums the decode replicas
only: every client request is one decode-leg request there, so a run's Δcount still equals
its requests (the prefill legs stay in the `replica`-labelled series).

So a client that reads vLLM names (the bench's `prom.parse` / `prom.delta`, e.g. the
prefix-cache hit rate) sees the whole deployment, and `replica_summary`
(`workbench.analysis.replicas`) splits it per replica. In PromQL, select either the
`replica`-labelled series or the unlabelled aggregate, never sum both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families

from workbench.router.disagg import DisaggRouter, Histogram

if TYPE_CHECKING:
    from workbench.router.forward import Router

REPLICA_LABEL = "replica"


class RouterCollector:
    """prometheus_client collector over a live `Router` (read at scrape time)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from router_families(self.router)
        if isinstance(self.router, DisaggRouter):
            yield from disagg_families(self.router)
        requests_from = None
        if isinstance(self.router, DisaggRouter):
            requests_from = {r.index for r in self.router.decode_members}
        yield from replica_families({r.index: r.last_metrics for r in self.router.pool.replicas
                                     if r.last_metrics}, requests_from)


def router_families(router: Router) -> Iterator[Metric]:
    replicas = router.pool.replicas
    per_replica = (
        ("router_requests", "Requests sent to each replica (retries included).",
         CounterMetricFamily, lambda r: r.requests_total),
        ("router_requests_outstanding", "Requests in flight on each replica.",
         GaugeMetricFamily, lambda r: r.outstanding),
        ("router_retries", "Requests that failed on the replica and were retried elsewhere.",
         CounterMetricFamily, lambda r: r.retries_total),
        ("router_replica_failures", "Times the replica was marked dead.",
         CounterMetricFamily, lambda r: r.failures_total),
        ("router_replica_restarts", "Times the replica came back after a restart.",
         CounterMetricFamily, lambda r: r.restarts_total),
        ("router_replica_up", "1 while the replica is routed to, 0 once marked dead.",
         GaugeMetricFamily, lambda r: int(r.alive)),
    )
    for name, doc, family, value in per_replica:
        m = family(name, doc, labels=[REPLICA_LABEL])
        for r in replicas:
            m.add_metric([str(r.index)], float(value(r)))
        yield m
    for name, doc, total in (
        ("router_client_requests", "Completion requests received.", router.client_requests),
        ("router_failed_requests", "Requests no live replica could complete.",
         router.failed_requests),
        ("router_resumed_streams", "Streams continued on another replica after a failure.",
         router.resumed_streams),
        ("router_restarted_requests", "Requests sent again from scratch after a failure.",
         router.restarted_requests),
    ):
        yield CounterMetricFamily(name, doc, value=float(total))
    d = CounterMetricFamily("router_routing_decisions", "Routing decisions by reason.",
                            labels=["reason"])
    for reason, count in sorted(router.decisions.items()):
        d.add_metric([reason], float(count))
    yield d
    cfg = router.config
    info = GaugeMetricFamily("router_info", "The router's configuration.",
                             labels=["policy", "num_replicas", "prefix_blocks", "block_size"])
    info.add_metric([cfg.policy, str(len(replicas)), str(cfg.prefix_blocks),
                     str(cfg.block_size)], 1.0)
    yield info


def disagg_families(router: DisaggRouter) -> Iterator[Metric]:
    m = CounterMetricFamily("workbench:disagg_prefill_requests",
                            "Prefill attempts sent to each prefill replica (retries included).",
                            labels=[REPLICA_LABEL])
    for r in router.prefill_members:
        m.add_metric([str(r.index)], float(router.prefill_requests[r.index]))
    yield m
    for name, doc, value in (
        ("workbench:disagg_prefill_retries",
         "Failed prefill attempts retried on another prefill replica.", router.prefill_retries),
        ("workbench:disagg_prefill_fallbacks",
         "Requests sent to a decode replica without KV: no prefill replica could prefill.",
         router.prefill_fallbacks),
        ("workbench:disagg_prefill_no_params",
         "Prefills answered with null kv_transfer_params (the decode replica recomputes).",
         router.prefill_no_params),
        ("workbench:disagg_kv_push_requests",
         "kv_push: prefill legs that named a decode replica to push the KV to.",
         router.push_requests),
        ("workbench:disagg_kv_push_misses",
         "kv_push: of those, decode legs that did not start on that replica with the KV "
         "(it was dead, or the prefill fell back / returned no params).",
         router.push_misses),
    ):
        yield CounterMetricFamily(name, doc, value=float(value))
    for name, doc, hist in (
        ("workbench:disagg_prefill_seconds",
         "Prefill leg: first prefill attempt sent to its answer read (retries included).",
         router.prefill_seconds),
        ("workbench:disagg_decode_first_byte_seconds",
         "Decode leg: sent to the first byte for the client (first event, or the JSON answer).",
         router.decode_first_byte_seconds),
    ):
        yield _histogram(name, doc, hist)
    cfg = router.config
    info = GaugeMetricFamily("workbench:disagg_info", "The disaggregated router's configuration.",
                             labels=["prefill_policy", "decode_policy", "num_prefill",
                                     "num_decode", "kv_push"])
    info.add_metric([cfg.prefill_policy, cfg.decode_policy, str(len(router.prefill_members)),
                     str(len(router.decode_members)), str(cfg.kv_push).lower()], 1.0)
    yield info


def _histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=hist.cumulative(), sum_value=hist.sum)


def _combine(family: str, sample: str, kind: str, values: list[float]) -> float:
    if kind == "gauge" and (sample.endswith("_perc") or "usage" in sample):
        return sum(values) / len(values)
    if family.endswith("_info"):
        return max(values)
    return sum(values)


REQUEST_COUNTERS = ("vllm:request_success",)


def _per_request(family: Metric) -> bool:
    return family.type == "histogram" or family.name.removesuffix("_total") in REQUEST_COUNTERS


def replica_families(texts: dict[int, str],
                     requests_from: set[int] | None = None) -> Iterator[Metric]:
    """Each replica's families with a `replica` label, plus the aggregate samples;
    `requests_from`: the replicas whose request-level families (histograms, request
    counters) make the aggregate (a disaggregated router's decode replicas)."""
    families: dict[str, Metric] = {}
    agg: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for index, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                agg[fam.name] = {}
            for s in fam.samples:
                if REPLICA_LABEL in s.labels:
                    continue  # not a replica's own series
                out.add_sample(s.name, {**s.labels, REPLICA_LABEL: str(index)}, s.value)
                if requests_from is not None and index not in requests_from and \
                        _per_request(fam):
                    continue  # a prefill leg: in its replica's series, not the aggregate
                key = (s.name, tuple(sorted(s.labels.items())))
                agg[fam.name].setdefault(key, []).append(float(s.value))
    for name, out in families.items():
        for (sample, labels), values in agg[name].items():
            out.add_sample(sample, dict(labels), _combine(name, sample, out.type, values))
        yield out

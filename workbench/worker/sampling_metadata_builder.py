"""SamplingMetadata from the scheduled requests: the worker side of the sampler's input.

The model runner calls `SamplingMetadataBuilder.build` every step with its own states of the
requests it samples (`CachedRequestState`, in batch order) and the drafts it verifies; the
sampler then reads only the metadata. What outlives a step is the seeded requests'
generators: created at a request's first sampled row, advanced by every draw, dropped when
the scheduler lists the request in `finished_req_ids`.

Per-row tensors are built only when some row samples: an all-greedy batch costs one pass over
its requests (greedy check and min_tokens) and no tensor. A request whose own parameters
cannot be turned into tensors (values broken after validation) is recorded in `failed` and
its row filled with neutral values, so the other rows are sampled as if it were not there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from workbench.sample.metadata import SamplingMetadata
from workbench.sample.sampler import sampling_error
from workbench.sampling_params import SamplingParams
from workbench.worker.request_state import CachedRequestState


def make_sampling_metadata(
    requests: Sequence[CachedRequestState], device: torch.device,
    failed: dict[str, str] | None = None,
) -> SamplingMetadata:
    """Metadata with no generators (every sampled row draws from the sampler's generator) and
    no drafts; `SamplingMetadataBuilder.build` adds both."""
    random_rows: list[int] = []
    min_tokens: dict[int, tuple[int, list[int]]] = {}
    for i, req in enumerate(requests):
        params = req.sampling_params
        if params.temperature != 0.0:
            random_rows.append(i)
        if params.min_tokens:
            remaining = params.min_tokens - req.num_output_tokens
            if remaining > 0:
                banned = list(params.stop_token_ids)
                if req.eos_token_id is not None:
                    banned.append(req.eos_token_id)
                if banned:
                    min_tokens[i] = (remaining, banned)
    n = len(requests)
    temperature = top_k = top_p = None
    if random_rows:
        temperature, top_k, top_p = _sampling_tensors(requests, device, failed)
    return SamplingMetadata(
        request_ids=[r.req_id for r in requests],
        temperature=temperature,
        all_greedy=not random_rows,
        all_random=len(random_rows) == n,
        top_k=top_k,
        top_p=top_p,
        random_rows=random_rows,
        generators={},
        min_tokens=min_tokens,
    )


def _sampling_tensors(
    requests: Sequence[CachedRequestState], device: torch.device, failed: dict[str, str] | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """temperature [n] float32, top_k [n] int64 (None if no row uses it), top_p [n] float32
    (None if no row uses it). Row by row when the batched build raises and failures are
    collected: a failing request is recorded and its row neutral (1.0, 0, 1.0)."""
    params = [r.sampling_params for r in requests]
    try:
        return _tensors(params, device)
    except Exception:
        if failed is None:
            raise
    for i, p in enumerate(params):
        try:
            _tensors([p], device)
        except Exception as e:
            failed.setdefault(requests[i].req_id, sampling_error(e))
            params[i] = SamplingParams(temperature=1.0)
    return _tensors(params, device)


def _tensors(
    params: list[SamplingParams], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    temperature = torch.tensor(
        [p.temperature for p in params], dtype=torch.float32, device=device)
    top_ks = [p.top_k for p in params]
    top_k = (torch.tensor(top_ks, dtype=torch.int64, device=device)
             if any(k > 0 for k in top_ks) else None)
    top_ps = [p.top_p for p in params]
    top_p = (torch.tensor(top_ps, dtype=torch.float32, device=device)
             if any(p < 1.0 for p in top_ps) else None)
    return temperature, top_k, top_p


class SamplingMetadataBuilder:
    """The model runner's sampling state: the seeded requests' generators, by request id."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[str, torch.Generator] = {}

    def remove_requests(self, request_ids: Iterable[str]) -> None:
        """Forget finished requests (their generators)."""
        for rid in request_ids:
            self.generators.pop(rid, None)

    def build(
        self,
        requests: Sequence[CachedRequestState],
        spec_decode_tokens: dict[str, list[int]] | None = None,
        failed: dict[str, str] | None = None,
    ) -> SamplingMetadata:
        """Metadata for `requests` (one row each, in order). With `spec_decode_tokens`
        (request id -> drafts being verified) it carries every row's drafts and the draft
        distributions (`CachedRequestState.spec_token_probs`) for `Sampler.verify`."""
        meta = make_sampling_metadata(requests, self.device, failed)
        for i in meta.random_rows:
            req = requests[i]
            seed = req.sampling_params.seed
            if seed is None:
                continue
            gen = self.generators.get(req.req_id)
            if gen is None:
                try:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(seed)
                except Exception as e:
                    if failed is None:
                        raise
                    failed.setdefault(req.req_id, sampling_error(e))
                    continue
                self.generators[req.req_id] = gen
            meta.generators[i] = gen
        if spec_decode_tokens is not None:
            drafts = [spec_decode_tokens.get(r.req_id, []) for r in requests]
            meta.spec_token_ids = drafts
            meta.draft_probs = [r.spec_token_probs if d else None
                                for r, d in zip(requests, drafts, strict=True)]
        return meta

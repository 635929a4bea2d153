"""Sampler: logits of the rows that need a token + SamplingMetadata -> one token id per row.

Greedy rows take the argmax. Sampled rows apply temperature, top-k, then top-p, and draw with
the request's own `torch.Generator` (`SamplingMetadata.generators`: seeded from
`SamplingParams.seed`, kept by the model runner from step to step, so the same seed gives the
same tokens whatever else is in the batch) or the sampler's generator when unseeded.
`min_tokens` suppresses EOS and stop tokens until enough tokens exist. The sampler reads only
tensors and the metadata (`workbench.sample.metadata`), never a Request.

Batched, with the tokens of a row-by-row sampler: one max over the batch for the greedy rows;
the sampled rows' noise is drawn row by row (each from its own generator: a row's draws never
depend on the batch) into one [rows, vocab] buffer, then one division and argmax for all.
Top-k and top-p read each row's values in descending order; on CPU a values-only numpy sort
gives them (`sorted_desc_values`: torch.sort also builds indices, ~100x slower for [48, 4096]),
and top-p maps its cut back to tokens by value, falling back to torch.sort's indices only when
the cut splits tied values (`top_p_drop`), so the kept tokens are exactly torch.sort's.
"""

from __future__ import annotations

import numpy as np
import torch

from workbench.sample.metadata import SamplingMetadata
from workbench.sample.rejection_sampler import greedy_verify, rejection_sample


def greedy_ids(logits: torch.Tensor) -> list[int]:
    """The argmax token of each row (the first on ties, as argmax). `max(dim).indices`:
    the same ids, ~3x faster than `argmax(dim)` on CPU for [64, 8192] fp32 logits."""
    return logits.max(dim=-1).indices.tolist()


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        # Draws of the sampled rows without a seed of their own.
        self.engine_generator = torch.Generator(device=device)
        self.engine_generator.manual_seed(seed)

    def _generator(self, metadata: SamplingMetadata, row: int) -> torch.Generator:
        return metadata.generators.get(row, self.engine_generator)

    def __call__(
        self, logits: torch.Tensor, metadata: SamplingMetadata,
        failed: dict[str, str] | None = None,
    ) -> list[int]:
        """logits: [num_reqs, vocab] float32. Returns one token id per row.

        With `failed`, an error in one request's own processing (its penalties, filters or
        draw) is recorded there as request id -> message and that row's token is -1; the
        other rows are sampled as if it were not in the batch. Without it, errors raise."""
        self._apply_min_tokens(logits, metadata, failed=failed)
        ids = metadata.request_ids
        # every row is overwritten when all are sampled (a failed one ends as -1 below)
        out = [-1] * len(ids) if metadata.all_random else greedy_ids(logits)
        if not metadata.all_greedy:
            rows = [i for i in metadata.random_rows if failed is None or ids[i] not in failed]
            rows, probs = self._rows_probs(logits, metadata, rows, failed)
            if rows:
                for i, t in zip(rows, self._race(probs, metadata, rows, failed), strict=True):
                    if t >= 0:
                        out[i] = t
        if failed:
            out = [-1 if rid in failed else t for rid, t in zip(ids, out, strict=True)]
        return out

    def _race(
        self, probs: torch.Tensor, metadata: SamplingMetadata, rows: list[int],
        failed: dict[str, str] | None,
    ) -> list[int]:
        """One draw per row of `probs` (row j is request rows[j]), -1 for a row whose draw
        failed (recorded). Exponential race (as vLLM): argmax(p / E), E ~ Exp(1), is a draw
        from p; each row's E from its own generator, as many values as a row-by-row draw
        takes, then one division and argmax over the batch."""
        noise = torch.empty_like(probs)
        bad: list[int] = []
        for j, i in enumerate(rows):
            try:
                noise[j].exponential_(generator=self._generator(metadata, i))
            except Exception as e:
                _record(failed, metadata.request_ids[i], e)
                bad.append(j)
        if bad:
            noise[bad] = 1.0
        tokens = (probs / noise).argmax(dim=-1).tolist()
        for j in bad:
            tokens[j] = -1
        return tokens

    def _rows_probs(
        self, logits: torch.Tensor, metadata: SamplingMetadata, rows: list[int],
        failed: dict[str, str] | None,
    ) -> tuple[list[int], torch.Tensor]:
        """The rows that got sampling probabilities and those [len, vocab] probabilities, one
        batched call; if that raises and failures are being collected, row by row so the
        failing request is found (left out) and the rest go on."""
        if not rows:
            return [], logits[:0]
        try:
            return rows, self.sampling_probs(logits[rows], metadata, rows)
        except Exception:
            if failed is None:
                raise
        ok: list[int] = []
        probs: list[torch.Tensor] = []
        for i in rows:
            try:
                probs.append(self.sampling_probs(logits[i : i + 1], metadata, [i]))
                ok.append(i)
            except Exception as e:
                _record(failed, metadata.request_ids[i], e)
        return ok, (torch.cat(probs) if probs else logits[:0])

    @staticmethod
    def sampling_probs(
        logits: torch.Tensor, metadata: SamplingMetadata, index: list[int]
    ) -> torch.Tensor:
        """Row j of `logits` processed with request index[j]'s temperature, top-k and top-p
        (index[j] must be a sampled row); returns probabilities [len(index), vocab] float32."""
        assert metadata.temperature is not None, "sampling_probs of an all-greedy batch"
        temps = metadata.temperature[index]
        logits = logits.float() / temps[:, None]
        vocab = logits.shape[-1]
        if metadata.top_k is not None:
            k = metadata.top_k[index]
            keep = (k > 0) & (k < vocab)
            if bool(keep.any()):
                k = torch.where(keep, k, vocab)
                kth = sorted_desc_values(logits).gather(1, (k - 1)[:, None])
                logits = logits.masked_fill(logits < kth, float("-inf"))
        if metadata.top_p is not None:
            p = metadata.top_p[index]
            if bool((p < 1.0).any()):
                logits = logits.masked_fill(top_p_drop(logits, p), float("-inf"))
        return logits.softmax(dim=-1)

    def verify(
        self, logits: torch.Tensor, metadata: SamplingMetadata,
        failed: dict[str, str] | None = None,
    ) -> list[list[int]]:
        """Speculative verification. Request i owns len(spec_token_ids[i]) + 1 consecutive
        rows of logits (the target at its last confirmed token and at each draft); returns
        its accepted drafts plus one token (the correction, or the bonus when all are
        accepted). Greedy requests accept while draft == argmax; sampled ones use the
        rejection sampler with q = draft_probs[i] (draft model) or one-hot (n-gram).
        With `failed`, a request whose verification raises is recorded there and gets []."""
        drafts = metadata.spec_token_ids
        assert drafts is not None, "verify needs SamplingMetadata.spec_token_ids"
        self._apply_min_tokens(logits, metadata, failed=failed)
        argmax = greedy_ids(logits)
        random = set(metadata.random_rows)
        draft_probs = metadata.draft_probs
        out: list[list[int]] = []
        row = 0
        for i, (rid, draft) in enumerate(zip(metadata.request_ids, drafts, strict=True)):
            n = len(draft) + 1
            try:
                if failed is not None and rid in failed:
                    out.append([])
                elif i not in random:
                    out.append(greedy_verify(draft, argmax[row : row + n]))
                else:
                    probs = self.sampling_probs(logits[row : row + n], metadata, [i] * n)
                    q = draft_probs[i] if draft_probs is not None else None
                    out.append(rejection_sample(
                        draft, probs, None if q is None else q[: len(draft)],
                        self._generator(metadata, i),
                    ))
            except Exception as e:
                if failed is None:
                    raise
                _record(failed, rid, e)
                out.append([])
            row += n
        return out

    @staticmethod
    def _apply_min_tokens(
        logits: torch.Tensor, metadata: SamplingMetadata, failed: dict[str, str] | None = None,
    ) -> None:
        """Ban EOS/stop ids on rows whose token would come before min_tokens. Without drafts
        row i is request i; when verifying, request i's rows start after the rows of the
        requests before it, and its j-th row is its output number (outputs so far) + j."""
        if not metadata.min_tokens:
            return
        drafts = metadata.spec_token_ids
        starts: list[int] = []
        if drafts is not None:
            row = 0
            for d in drafts:
                starts.append(row)
                row += len(d) + 1
        for i, (remaining, banned) in metadata.min_tokens.items():
            try:
                if drafts is None:
                    logits[i, banned] = float("-inf")
                else:
                    first = starts[i]
                    logits[first : first + min(remaining, len(drafts[i]) + 1), banned] = (
                        float("-inf"))
            except Exception as e:
                if failed is None:
                    raise
                _record(failed, metadata.request_ids[i], e)


def sorted_desc_values(logits: torch.Tensor) -> torch.Tensor:
    """Each row's values in descending order: `logits.sort(dim=-1, descending=True).values`.
    A sort's value sequence is unique whatever it does with ties, so on CPU numpy's
    values-only sort gives the same tensor (torch.sort also builds the indices: ~100x slower
    for [48, 4096] fp32). A batch with a row whose maximum is not finite (NaN, +inf), and
    any other device or dtype, takes torch.sort."""
    if logits.device.type == "cpu" and logits.dim() == 2 and logits.dtype == torch.float32:
        values = torch.from_numpy(np.ascontiguousarray(np.sort(logits.numpy(), axis=-1)[:, ::-1]))
        if bool(values[:, 0].isfinite().all()):
            return values
    return logits.sort(dim=-1, descending=True).values


def top_p_drop(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[n, vocab] bool: the tokens top-p drops, row i with top_p[i] (vLLM's semantics: a token
    is dropped when the probability mass strictly before it, in descending order, already
    reaches top_p).

    Exactly the mask of the reference below (torch.sort, then its indices scatter the sorted
    decisions back), found without the indices when it can be: when each row's decisions in
    sorted order are kept-then-dropped and the last kept value differs from the first dropped
    one, the dropped tokens are those below the last kept value. Otherwise (the cut splits
    tied values, whose order torch.sort leaves unspecified, or a non-finite row) the
    reference's own indices decide."""
    sorted_logits = sorted_desc_values(logits)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p[:, None]
    vocab = logits.shape[-1]
    kept = vocab - drop_sorted.sum(dim=-1, keepdim=True)  # >= 1 for top_p > 0
    last_kept = sorted_logits.gather(1, (kept - 1).clamp(min=0))
    first_dropped = sorted_logits.gather(1, kept.clamp(max=vocab - 1))
    positions = torch.arange(vocab, device=logits.device)
    suffix = torch.equal(drop_sorted, positions >= kept)  # kept, kept, ..., dropped, dropped
    split = (kept < vocab) & (first_dropped == last_kept)
    if suffix and not bool((split | (kept == 0) | ~last_kept.isfinite()).any()):
        return logits < last_kept
    idx = logits.sort(dim=-1, descending=True).indices
    return torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)


def _record(failed: dict[str, str] | None, request_id: str, error: Exception) -> None:
    """Attribute a per-request failure (re-raised when failures are not being collected)."""
    if failed is None:
        raise error
    failed.setdefault(request_id, sampling_error(error))


def sampling_error(error: Exception) -> str:
    """The message a request's failed sampling is recorded with."""
    return f"sampling failed: {type(error).__name__}: {error}"

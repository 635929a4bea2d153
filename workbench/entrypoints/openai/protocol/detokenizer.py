"""Streaming text: incremental detokenization and stop strings applied at the front door.

Place in the flow: the server's `generate.Generation` feeds each sequence's new token ids to
an `IncrementalDetokenizer` and the resulting text to a `StopStringChecker`; what comes out is
the text delta of one streamed chunk. The router's `relay.StreamRelay` applies the client's
stop strings with the same `StopStringChecker` when it resumes a broken stream.

    ids:  | ... already emitted ... | prefix_offset .. read_offset | new ids |
    delta = decode(ids[prefix_offset:]) minus decode(ids[prefix_offset:read_offset]),
    held back while it ends in U+FFFD (an incomplete UTF-8 sequence split across tokens).

`flush()` at the end returns whatever decode(all ids) has beyond the emitted text, so the
concatenated deltas equal the non-streamed text.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # emitted so far
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int] | tuple[int, ...]) -> str:
        """Append tokens; return the new stable text (may be "")."""
        if not token_ids:
            return ""
        self.ids.extend(token_ids)
        prefix = self._decode(self.ids[self._prefix_offset:self._read_offset])
        full = self._decode(self.ids[self._prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            delta = full[len(prefix):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """The text not yet emitted, from decoding every id (call once, at the end)."""
        full = self._decode(self.ids)
        if not full.startswith(self.text):
            return ""
        delta = full[len(self.text):]
        self.text = full
        return delta


class StopStringChecker:
    """Release text, holding back len(longest stop) - 1 characters that could start a stop.

    `feed(delta, final)` returns (text to release, the stop string hit or None). On a hit the
    released text ends just before the stop string (vLLM's include_stop_str_in_output=False).
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self._buf = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str | None]:
        if not self.stops:
            return delta, None
        self._buf += delta
        hit, pos = None, -1
        for s in self.stops:
            p = self._buf.find(s)
            if p != -1 and (pos == -1 or p < pos):
                hit, pos = s, p
        if hit is not None:
            out, self._buf = self._buf[:pos], ""
            return out, hit
        if final or len(self._buf) <= self.hold:
            out = self._buf if final else ""
            self._buf = "" if final else self._buf
            return out, None
        cut = len(self._buf) - self.hold
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out, None

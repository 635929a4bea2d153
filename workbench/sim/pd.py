"""Prefill/decode disaggregation in the simulator: the two halves of the handshake the real
P2pConnector / NixlConnector run (docs/disaggregation.md), on the real scheduler.

    client ──> router ──prefill leg──> prefill instance (ProducerConnector)
                 │        max_tokens 1; finished by length, its blocks are HELD
                 │        (request_finished -> delay), not freed
                 └──decode leg──> decode instance (ConsumerConnector), at the prefill's end
                          prompt tokens past the local prefix-cache hit, all but the last,
                          are external: blocks allocated, the request WAITING_FOR_REMOTE_KVS
                          while the KV crosses the producer's link (bytes / bandwidth +
                          latency, one transfer at a time per link); then it runs: its first
                          step computes the last prompt token and samples the first output
                          token (vLLM recomputes it for the logits), the rest decode.
                 the read done: the producer frees the held blocks (finished_sending)

Transferred tokens count as computed on the decode instance (`num_computed_tokens`, and the
record's `num_cached_tokens` as vLLM's usage reports them), never recomputed. A decode leg
preempted after its load recomputes its prompt (the hold is gone), as the real one does.

TTFT is the client's: the decode instance's first token (prefill leg + KV transfer + the
decode's first step, queueing included), which is what a client of vLLM's proxy (or
`workbench disagg`) streams; the prefill leg's own end and the transfer are kept per request
(`SimResult.legs`) and on the record (`server_kv_transfer_s`, `server_kv_wait_s`,
`server_kv_transfer_bytes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.core.request import RequestStatus
from workbench.sim.connectors import Load, SimConnector
from workbench.sim.transfer import LinkQueue

if TYPE_CHECKING:
    from workbench.core.request import Request
    from workbench.distributed.kv_transfer.metadata import KVConnectorOutput


class ProducerConnector(SimConnector):
    """A prefill instance: a prefill leg finished by length keeps its blocks until a decode
    instance has read them (`finished_sending`)."""

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED or not block_ids:
            return False, None  # an error or an abort: nothing to hand over
        return True, {"do_remote_prefill": True, "remote_block_ids": list(block_ids)}

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        s = output.stats
        if output.finished_sending:
            self._count("workbench:kv_transfer_sends", s.sends)
            self._count("workbench:kv_transfer_send_bytes", s.send_bytes)
            self._count("workbench:kv_transfer_send_time", s.send_time_s)
            self._count("workbench:kv_transfer_send_wait_time", s.send_wait_s)


class ConsumerConnector(SimConnector):
    """A decode instance: a request `expect`ed from a producer loads its prompt's KV (all
    but the last token, past the local prefix-cache hit) over the producer's link."""

    def __init__(self, kv_bytes_per_token: int) -> None:
        super().__init__(kv_bytes_per_token)
        self._expected: dict[str, tuple[int, LinkQueue]] = {}

    def expect(self, request_id: str, source: int, link: LinkQueue) -> None:
        """`request_id` comes with a handshake from producer `source` over `link`."""
        self._expected[request_id] = (source, link)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        if request.request_id not in self._expected:
            return 0, False  # no handshake (or already read once): computed here
        ext = max(0, len(request.prompt_token_ids) - 1 - num_computed_tokens)
        return ext, ext > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        entry = self._expected.pop(request.request_id, None)
        if entry is None:
            return
        source, link = entry
        self._count("workbench:kv_transfer_recv_queries", 1)
        n = num_external_tokens
        # nothing to read (the local prefix cache held the prompt): a zero-byte load tells
        # the producer at once that its hold can go, as the real consumer does
        self._loads.append(Load(request.request_id, n, n * self.kv_bytes_per_token,
                                link if n > 0 else None, source))

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for rid, (nbytes, seconds) in output.recv_info.items():
            if rid in output.finished_recving:
                self._count("workbench:kv_transfer_recv_bytes", nbytes)
                self._count("workbench:kv_transfer_recv_time", seconds)
                self._count("workbench:kv_transfer_recv_tokens",
                            nbytes // self.kv_bytes_per_token)

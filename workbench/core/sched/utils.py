"""Stop conditions, checked after each appended output token (vLLM V1's order)."""

from __future__ import annotations

from workbench.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the finished status on `request` and return True if it must stop now.

    Order: length caps (max_tokens, max_model_len) first; then nothing stops before
    `min_tokens`; then EOS (unless ignore_eos), then `stop_token_ids` (the stop token is kept
    in the output, its id recorded as `stop_reason`).
    """
    num_output = len(request.output_token_ids)
    if len(request.all_token_ids) >= max_model_len or num_output >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    params = request.sampling_params
    if num_output < params.min_tokens:
        return False
    last = request.output_token_ids[-1]
    if last == request.eos_token_id and not params.ignore_eos:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if params.stop_token_ids and last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False

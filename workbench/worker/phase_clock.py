"""PhaseClock: the model runner's per-phase stopwatch for the step's overhead account.

    clock = PhaseClock(device)        at the start of execute_model's forward path
    ... prepare inputs ...            times.prepare_inputs_s = clock.lap()
    ... forward ...                   times.forward_s = clock.lap()

A lap is `time.perf_counter()` since the previous lap (or the start): host time. On CUDA the
kernels run asynchronously, so a forward's lap is the time to launch it, and the wait for the
device lands in the first phase that synchronizes (the sampler's `.tolist()`).
WORKBENCH_SYNC_STEP_TIMING=1 (read when the clock is made, i.e. every step) synchronizes the
device before each lap and at the start: every phase then holds its own device time, at the
cost of the host/device overlap (steps get slower; use it to attribute, not to benchmark).
On CPU nothing is asynchronous and the variable changes nothing.
"""

from __future__ import annotations

import os
import time

import torch

SYNC_ENV = "WORKBENCH_SYNC_STEP_TIMING"


def sync_step_timing() -> bool:
    """WORKBENCH_SYNC_STEP_TIMING is set to something other than "" or "0"."""
    return os.environ.get(SYNC_ENV, "") not in ("", "0")


class PhaseClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sync = device.type == "cuda" and sync_step_timing()
        if self.sync:
            torch.cuda.synchronize(device)
        self.last = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap (the device synchronized first when asked)."""
        if self.sync:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed

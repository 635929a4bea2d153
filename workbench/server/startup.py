"""Start-up in the background: the server answers /health (503, with the reason) while it builds
the engine, loads the kernels and warms up; it reports ready only when it can serve at once.

    lifespan -> Startup(config, on_ready).start()          thread "server-startup"
      phase "engine"   LLMEngine(config): tokenizer, weights, KV pool (TP: the worker ranks)
      phase "kernels"  device "cpu": the C++ CPU kernels built (minutes, first time on a
                       machine) or loaded from the build cache (kernels.cpu.kernel_status())
      phase "warm-up"  one greedy request, 1 prompt token + 2 output tokens, stepped to the end
                       on the engine itself (a prefill and a decode step: every kernel the
                       model runs, first-call allocations); then the prefix cache and the
                       engine's counters and step trace are reset, so /metrics starts at 0
      on_ready(engine) the app starts its AsyncEngine loop; /health answers 200

A failure in any phase is logged with its traceback, /health answers 503 `{"status": "failed",
"reason": ...}` and `on_failure(message)` is called (`workbench serve` exits with it). The log
line at the end says how long start-up took and on what:
`server ready in 7.9 s: engine 1.2 s, kernels 6.1 s (paged_decode=..., ...), warm-up 0.6 s`.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from workbench.config import EngineConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.metrics.stats import EngineStats
from workbench.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
WARMUP_MAX_STEPS = 64
_PHASES = {
    "engine": "building the engine (tokenizer, weights, KV cache)",
    "kernels": "building or loading the C++ CPU kernels (a first build takes minutes)",
    "warm-up": "running one warm-up request",
}


def load_cpu_kernels() -> dict[str, str]:
    """Build or load every C++ CPU kernel now; kernel_status() afterwards."""
    from kernels.cpu import kernel_status, paged_decode, rms_norm, rotary

    for ext in (paged_decode.EXTENSION, rotary.EXTENSION, rms_norm.EXTENSION):
        ext.load()
    return kernel_status()


def warm_up(engine: LLMEngine) -> int:
    """Run one greedy request to the end on `engine` (no loop thread yet), then reset the
    prefix cache, the counters and the step trace. Returns the steps it took."""
    max_tokens = min(2, engine.max_model_len - 1)
    if max_tokens < 1:
        return 0
    token = engine.tokenizer.bos_token_id
    token = token if isinstance(token, int) and 0 <= token < engine.vocab_size else 0
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    req = engine.make_request([token], params, request_id="server-warmup")
    engine.add_request(req)
    steps = 0
    while engine.has_unfinished_requests():
        if steps >= WARMUP_MAX_STEPS:
            raise RuntimeError(f"the warm-up request did not finish in {steps} steps")
        engine.step()
        steps += 1
    if req.status.finish_reason == "error":
        raise RuntimeError(f"the warm-up request failed: {req.error}")
    if not engine.reset_prefix_cache():
        raise RuntimeError("the prefix cache could not be reset after the warm-up")
    engine.stats = EngineStats()
    return steps


class Startup:
    """Runs the phases in a daemon thread; `health()` says where it is."""

    def __init__(
        self, config: EngineConfig, on_ready: Callable[[LLMEngine], None],
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.status = "starting"  # starting | ready | failed | cancelled
        self.phase = "engine"
        self.error: str | None = None
        self.timings_s: dict[str, float] = {}
        self.kernels: dict[str, str] = {}
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="server-startup", daemon=True)

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def start(self) -> Startup:
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def cancel(self) -> None:
        """After this returns on_ready has either run or never will (the server is stopping;
        an engine built after this is shut down by the start-up thread)."""
        with self._lock:
            self._cancelled = True

    def health(self) -> dict[str, Any]:
        """The /health body while not ready: status, phase, reason, elapsed_s."""
        elapsed = round(time.perf_counter() - self.t0, 3)
        if self.status == "failed":
            reason = f"start-up failed ({self.phase}): {self.error}"
        elif self.status == "cancelled":
            reason = "the server is shutting down"
        else:
            reason = f"warming up: {_PHASES[self.phase]} ({elapsed:.1f} s so far)"
        return {"status": "failed" if self.status == "failed" else "starting",
                "phase": self.phase, "reason": reason, "elapsed_s": elapsed}

    # ------------------------------------------------------------------ the thread
    def _timed(self, phase: str, fn: Callable[[], Any]) -> Any:
        self.phase = phase
        logger.info("start-up: %s", _PHASES[phase])
        t = time.perf_counter()
        out = fn()
        self.timings_s[phase] = time.perf_counter() - t
        return out

    def _run(self) -> None:
        engine: LLMEngine | None = None
        try:
            engine = self._timed("engine", lambda: LLMEngine(self.config))
            if self.config.device == "cpu" and not self._cancelled:
                self.kernels = self._timed("kernels", load_cpu_kernels)
            steps = 0
            if not self._cancelled:
                steps = self._timed("warm-up", lambda: warm_up(engine))
            with self._lock:
                if self._cancelled:
                    self.status = "cancelled"
                    engine.shutdown()
                    return
                self.on_ready(engine)
                self.status = "ready"
            logger.info("server ready in %.1f s: %s (warm-up: %d engine steps)",
                        time.perf_counter() - self.t0, self.describe(), steps)
        except Exception as e:  # noqa: BLE001 - reported on /health, in the log, to on_failure
            self.error = f"{type(e).__name__}: {e}"
            self.status = "failed"
            logger.error("start-up failed while %s:\n%s", _PHASES[self.phase],
                         traceback.format_exc())
            if engine is not None:
                engine.shutdown()
            if self.on_failure is not None:
                self.on_failure(f"{self.phase}: {self.error}")

    def describe(self) -> str:
        """'engine 1.2 s, kernels 6.1 s (paged_decode=..., ...), warm-up 0.6 s'."""
        parts = []
        for phase, s in self.timings_s.items():
            extra = ""
            if phase == "kernels":
                extra = " (" + ", ".join(f"{k}={v}" for k, v in self.kernels.items()) + ")"
            parts.append(f"{phase} {s:.1f} s{extra}")
        return ", ".join(parts)

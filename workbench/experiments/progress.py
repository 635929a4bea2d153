"""Progress of a sequence of runs: a tqdm bar (elapsed / ETA; a widget in JupyterLab) and one
line per finished run with its time, the elapsed total and the ETA.

    progress = RunProgress(6, enabled=True)
    for ...:
        progress.start("max_num_batched_tokens=64 repeat 1/2")
        ...                                        # the run (its own request bar below)
        progress.done()                            # "[1/6] ... : 4.2 s  (elapsed 0:04, ETA 0:21)"
    progress.close()

Disabled, it prints nothing and costs nothing. Lines go through `tqdm.write` (stdout), so
they do not break the bar (stderr).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workbench.harness.replay import live_output


def clock(seconds: float) -> str:
    """0:04, 1:02:03."""
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class RunProgress:
    def __init__(self, total: int, enabled: bool = True, desc: str = "runs") -> None:
        self.total, self.enabled = total, enabled
        self.count = 0
        self.t0 = time.perf_counter()
        self._run_t0 = self.t0
        self._what = ""
        self.bar: Any = None
        if enabled and live_output():  # else the per-run lines alone
            try:
                from tqdm.auto import tqdm
            except ImportError:  # lines only
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr,
                                dynamic_ncols=True)

    def start(self, what: str) -> None:
        self._what, self._run_t0 = what, time.perf_counter()
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=True)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def done(self, note: str = "", what: str | None = None, seconds: float | None = None
             ) -> str:
        """Count the run; print and return its line. Runs that overlap (a cluster's) name
        themselves (`what`) and give their own time (`seconds`) instead of `start`'s."""
        self.count += 1
        now = time.perf_counter()
        elapsed = now - self.t0
        left = self.total - self.count
        eta = elapsed / self.count * left
        took = now - self._run_t0 if seconds is None else seconds
        text = (f"[{self.count}/{self.total}] {what or self._what}: {took:.1f} s"
                f"{'  ' + note if note else ''}  (elapsed {clock(elapsed)}, "
                f"ETA {clock(eta) if left else '0:00'})")
        if self.bar is not None:
            self.bar.update(1)
        self.line(text)
        return text

    def add(self, n: int) -> None:
        """`n` more runs than planned (adaptive repeats: `sequential`)."""
        self.total += n
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

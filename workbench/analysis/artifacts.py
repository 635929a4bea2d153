"""One logged run's artifacts read back: a JSON file, and the server counters an HTTP run logged.

    run_artifact_json(run_id, path, uri)   a JSON artifact of one run (summary.json,
                                           quality.json, verdicts.json, ...)
    run_delta(run_id, uri)                 the server's /metrics delta over one HTTP run
                                           (server_delta.json's "delta", `harness.prom.delta`:
                                           counters as `name_total{label="v"}` keys)

CSV artifacts (requests.csv, step_trace.csv) are `frames.run_artifact_frame`'s.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from workbench.analysis.frames import _client, no_progress_bar


def run_artifact_json(run_id: str, path: str, uri: str | None = None) -> Any:
    """The JSON artifact `path` of run `run_id`, parsed."""
    client = _client(uri)
    with tempfile.TemporaryDirectory() as tmp, no_progress_bar():
        local = client.download_artifacts(run_id, path, dst_path=tmp)
        return json.loads(Path(local).read_text())


def run_delta(run_id: str, uri: str | None = None) -> dict[str, Any]:
    """The /metrics delta an HTTP run logged (server_delta.json's "delta")."""
    return dict(run_artifact_json(run_id, "server_delta.json", uri)["delta"])

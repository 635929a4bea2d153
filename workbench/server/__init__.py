"""OpenAI-compatible HTTP server over the workbench engine (`workbench serve`).

    app.py            build_app(): lifespan, auth, readiness gate, errors, /health, /metrics
    startup.py        start-up in the background: engine, CPU kernels, one warm-up request
    openapi.py        /openapi.json: request bodies, statuses, response models
    openai_routes.py  /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models
    protocol.py       request models, the OpenAI-style error object
    json_values.py    values no field may hold (non-finite numbers, lone surrogates, huge arrays)
    inputs.py         prompts / chat template / SamplingParams -> engine Requests
    generate.py       engine streams merged into per-choice text deltas
    detokenizer.py    incremental detokenization, stop strings
    responses.py      response bodies and the per-request `metrics` object
    metrics.py        Prometheus metrics with vLLM's names
    serve.py          the command line (`workbench serve`)
"""

from __future__ import annotations

__all__ = ["build_app"]


def __getattr__(name: str) -> object:
    if name == "build_app":
        from workbench.server.app import build_app

        return build_app
    raise AttributeError(name)

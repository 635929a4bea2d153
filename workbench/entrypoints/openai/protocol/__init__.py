"""The OpenAI protocol, once, for every entry point (vLLM's `entrypoints/openai/protocol.py`).

    requests.py     CompletionRequest, ChatCompletionRequest, parse_request (a 400 naming the
                    field); json_values.py: values no field may hold
    responses.py    response bodies: choices, stream chunks, usage, the model list (dict
                    builders) and their pydantic models for /openapi.json
    errors.py       APIError: `{"error": {"message", "type", "param", "code"}}`
    sse.py          server-sent events: `encode_event` (server side), `SSEByteDecoder` /
                    `SSEDecoder` (client side), the `[DONE]` sentinel
    prompts.py      a request's prompt(s) as token ids: tokenization, the chat template
    detokenizer.py  IncrementalDetokenizer, StopStringChecker (streamed text)
    auth.py         APIKeyMiddleware: `Authorization: Bearer <key>`
    http.py         the request body (size cap, JSON) and a streaming response that always
                    closes its generator

Who reads it: `workbench.server` (the engine behind it), `workbench.router` (which speaks to
the replicas over HTTP only and imports nothing of the server), and the harness's HTTP
client (`harness/sse.py`, `harness/http_stream.py`). It imports nothing of workbench outside
this package (tests/entrypoints/test_protocol_imports.py), so the harness can sit above it and
the engine never enters it. Nothing is imported here: `import ...protocol.sse` stays light.
"""

"""What the front doors share (vLLM's `vllm/entrypoints`); the doors themselves are
`workbench/server` (`workbench serve`) and `workbench/router` (`workbench router`).

    openai/protocol/   the OpenAI wire format: request and response models, errors, SSE,
                       the prompt's token ids, the incremental detokenizer, the API key, the
                       HTTP body and streaming helpers. Below the harness in the layers (the
                       load generator reads the same SSE); imports nothing else of workbench.
    openai/cli_args.py `workbench serve`'s flags: the server parses its command line with
                       them, the router checks its replicas' flags with them.
"""

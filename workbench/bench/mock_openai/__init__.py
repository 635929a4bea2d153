"""A mock OpenAI-compatible server that streams tokens as fast as it can (`serve`; run it with
`python -m workbench.bench.mock_openai`): the system under test of `bench client-capacity`."""

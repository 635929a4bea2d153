"""`workbench bench client-capacity`: the load generator's own ceiling against a mock server,
beside vLLM's client (`cli` runs it; docs/client_capacity.md)."""

"""Traffic from the field: readers for the trace formats researchers bring, each giving a
harness `Workload` every target replays (the in-process engine, an HTTP server, the
simulator). docs/traces.md says where to get the real files.

    format    file                                   arrivals       prompts
    sharegpt  JSON list of conversations              none (the      the first turn's text,
                                                      template's)    tokenized
    burstgpt  CSV Timestamp, Model, Request tokens,   Timestamp (s)  synthesized, lengths
              Response tokens, Total tokens, Log Type
    azure     CSV TIMESTAMP, ContextTokens,           TIMESTAMP      synthesized, lengths
              GeneratedTokens                         (date-time)
    mooncake  JSONL timestamp (ms), input_length,     timestamp      shared blocks by hash
              output_length, hash_ids                                id, then synthesized

    options.py   TraceOptions (rate_scale, max_requests, window, max_model_len, ...), TraceRow
    csv_rows.py  the CSV reading both CSV formats share
    prompts.py   synthetic token ids, one deterministic block per Mooncake hash id
    build.py     window, drops (counted), arrival_s, -> Workload
    load.py      load_trace(format, path, tokenizer, seed, **params), FORMATS, trace_params;
                 a template's `workload: {trace: PATH, format: NAME, params}`: load_trace_spec,
                 trace_spec_problems
    samples.py   write_samples(dir): small files in each format the project writes itself

Replay the recorded times with `arrivals: {mode: trace}`; any other arrival mode re-samples
them (arrival_s is then ignored).
"""

from workbench.harness.traces.load import (
    FORMATS,
    load_trace,
    load_trace_spec,
    trace_params,
    trace_spec_problems,
)

__all__ = ["FORMATS", "load_trace", "load_trace_spec", "trace_params", "trace_spec_problems"]

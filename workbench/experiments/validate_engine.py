"""The engine side of the template check: knob names, the model folder, the server command,
and every variant's EngineConfig (config.json is read, no weights are loaded).

Place in the flow: `validate.template_problems` calls `check_target` and `check_engine`;
`engine_knobs` / `knob_default` also serve `promote.promoted_template`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from workbench.config import TOP_LEVEL_KNOBS
from workbench.errors import did_you_mean

TARGET_KEYS = ("kind", "model", "tokenizer", "base_url", "command", "ready_timeout_s", "env",
               "log_path", "api_key", "endpoint", "prompt_mode", "temperature", "ignore_eos",
               "poll_interval_s", "timeout_s")
TARGET_KINDS = ("in-process", "inprocess", "http", "openai", "simulated")
# The router's own flags a template's config may carry (workbench/router/cli.py ROUTER_KNOBS;
# a test keeps the two equal: this layer does not import the router).
ROUTER_KNOBS = ("num_replicas", "num_workers", "policy", "routing_policy", "prefix_blocks",
                "prefix_block_size", "load_bound_min", "load_bound_frac", "replica_threads",
                "replica_ready_timeout_s", "replica_log_dir", "replica_log_level",
                "replica_url", "scheduling_policy", "max_attempts", "health_interval_s",
                "num_prefill", "num_decode", "prefill_url", "decode_url", "prefill_policy",
                "decode_policy", "kv_push", "executor", "address", "replica_num_cpus",
                "replica_resources")
ROUTING_POLICIES = ("round_robin", "least_outstanding", "prefix_aware")



def _config_fields() -> list[Any]:
    from workbench.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig

    skip = {"model", "hf_config"}
    out = [f for f in fields(ModelConfig) if f.name not in skip]
    out += list(fields(CacheConfig))
    out += [f for f in fields(SchedulerConfig) if f.name != "max_model_len"]
    return out + list(fields(ParallelConfig))


def engine_knobs() -> tuple[str, ...]:
    """Every keyword `EngineConfig.from_kwargs` accepts (the `LLM(...)` knobs)."""
    return tuple(sorted({f.name for f in _config_fields()} | set(TOP_LEVEL_KNOBS)))


def knob_default(name: str) -> Any:
    """The engine's default for knob `name` (None when it has none or is derived)."""
    for f in _config_fields():
        if f.name == name and f.default is not MISSING:
            return f.default
    return False if name == "enforce_eager" else None


# --------------------------------------------------------------------------- target, model
def _folder_problem(key: str, value: Any, weights: bool) -> str | None:
    """Why `value` (template field `key`) is not a usable model folder, or None."""
    from workbench.config.named_models import NAMED_MODELS, resolve_model

    if not isinstance(value, str) or not value:
        return f"{key} ({value!r}) must be a local Hugging Face folder or a shipped name"
    path = Path(resolve_model(value))
    if not path.is_dir():
        return (f"{key} ({value!r}) is neither a local folder nor a shipped model name "
                f"({', '.join(NAMED_MODELS)}){did_you_mean(value, NAMED_MODELS)}")
    if not (path / "config.json").is_file():
        return f"{key} ({value!r}) has no config.json: not a Hugging Face model folder"
    if weights and not any(path.glob("*.safetensors")):
        return f"{key} ({value!r}) has no *.safetensors weights"
    if not weights and not any((path / f).is_file() for f in (
            "tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return f"{key} ({value!r}) has no tokenizer files (tokenizer.json, ...)"
    return None


def check_target(target: dict[str, Any], out: list[str]
                  ) -> tuple[str | None, str | None, str | None]:
    """(engine model folder, tokenizer folder, server) with server None for in-process,
    'serve' / 'router' for the workbench's own server, 'foreign' otherwise."""
    from workbench.config.named_models import resolve_model

    kind = str(target.get("kind", "in-process"))
    if kind == "simulated":
        return _check_simulated_target(target, out)
    for key in sorted(set(target) - set(TARGET_KEYS), key=str):
        out.append(f"unknown target key {key!r}{did_you_mean(key, TARGET_KEYS)}")
    if kind not in TARGET_KINDS:
        out.append(f"target.kind ({kind!r}) must be 'in-process', 'http' or 'simulated'"
                   f"{did_you_mean(kind, TARGET_KINDS)}")
        return None, None, "foreign"
    tok_key = "tokenizer" if "tokenizer" in target else "model"
    tok_value = target.get(tok_key, "bundled")
    if kind in ("in-process", "inprocess"):
        bad = _folder_problem("target.model", target.get("model", "bundled"), weights=True)
        model = None if bad else resolve_model(str(target.get("model", "bundled")))
        server = None
    else:
        model, server, bad = None, "foreign", None
        if "base_url" not in target:
            out.append("target.base_url is missing: an http target needs one, e.g. "
                       "http://127.0.0.1:8123/v1")
        if target.get("command"):
            server, args = _workbench_server(target["command"])
            if server != "foreign":
                flag = _command_model(args, server)
                if flag is None:
                    bad = f"target.command starts `workbench {server}` without --model"
                else:
                    bad = _folder_problem("target.command --model", flag, weights=True)
                    model = None if bad else resolve_model(flag)
    if bad:
        out.append(bad)
    tok_bad = _folder_problem(f"target.{tok_key}", tok_value, weights=False)
    if tok_bad and not (bad and tok_key == "model" and server is None):
        hint = ("" if server is None else " (an http target builds its prompts with the "
                "tokenizer of target.tokenizer, else target.model)")
        out.append(tok_bad + hint)
    tokenizer = None if tok_bad else resolve_model(str(tok_value))
    return model, tokenizer, server


def _check_simulated_target(target: dict[str, Any], out: list[str]
                            ) -> tuple[None, str | None, str]:
    """A simulated target's keys (workbench/sim/target.py); its tokenizer folder."""
    from workbench.config.named_models import resolve_model
    from workbench.sim.target import TARGET_KEYS as SIM_KEYS
    from workbench.sim.target import target_problems, tokenizer_name

    for key in sorted(set(target) - set(SIM_KEYS), key=str):
        out.append(f"unknown simulated target key {key!r}{did_you_mean(key, SIM_KEYS)}")
    out += target_problems({k: v for k, v in target.items() if k in SIM_KEYS})
    tok = tokenizer_name(target)
    bad = _folder_problem("target.tokenizer", tok, weights=False)
    if bad:
        out.append(bad)
    return None, None if bad else resolve_model(tok), "simulated"


def check_simulated(baseline: dict[str, Any], name: str | None, values: list[Any],
                    target: dict[str, Any], out: list[str]) -> None:
    """Each variant's knobs against what the simulator models, and its profile (a file, or
    `auto`'s match for its dtype), each problem once."""
    from workbench.sim.profile_lookup import profile_problems
    from workbench.sim.target import config_problems

    plan = [("baseline", baseline)] + ([] if name is None else [
        (_label(name, v), {**baseline, name: v}) for v in values])
    seen: set[str] = set()
    for label, cfg in plan:
        for p in config_problems(target, cfg) + profile_problems(target, cfg):
            if p not in seen:
                seen.add(p)
                out.append(f"{label}: {p}")


def _workbench_server(command: Any) -> tuple[str, list[str]]:
    """('serve' | 'router', the arguments after the verb) when `command` starts the
    workbench's own server, else ('foreign', [])."""
    argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    for i, tok in enumerate(argv):
        if (Path(tok).name == "workbench" or tok == "workbench.cli") and i + 1 < len(argv):
            if argv[i + 1] in ("serve", "router", "disagg"):
                verb = "serve" if argv[i + 1] == "serve" else "router"
                return verb, argv[i + 2:]
        if tok == "workbench.server.serve":
            return "serve", argv[i + 1:]
        if tok in ("workbench.router.cli", "workbench.router.disagg_cli"):
            return "router", argv[i + 1:]
    return "foreign", []


def _command_model(args: list[str], server: str) -> str | None:
    for i, tok in enumerate(args):
        if tok == "--model" and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith("--model="):
            return tok.split("=", 1)[1]
    first = args[0] if args else None
    return first if server == "serve" and first and not first.startswith("-") else None


def _command_knobs(args: list[str], server: str) -> dict[str, Any]:
    """Engine knobs the command sets itself (`--max-num-seqs 8`, `--no-enable-...`); the
    template's config is appended after them, and the last flag wins."""
    knobs, router = set(engine_knobs()), server == "router"
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            continue
        name, sep, inline = tok[2:].partition("=")
        key = name.replace("-", "_")
        takes = sep == "" and i < len(args) and not args[i].startswith("--")
        text = inline if sep else (args[i] if takes else None)
        if takes:
            i += 1
        if router and key == "scheduling_policy":
            key = "policy"
        elif router and key in ROUTER_KNOBS:
            continue
        if key in knobs:
            out[key] = True if text is None else _parse(text)
        elif key.startswith("no_") and key[3:] in knobs:
            out[key[3:]] = False
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# --------------------------------------------------------------------------- engine configs
def _label(name: str | None, value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, dict) else repr(value)
    return f"variant {name}={text}"


def check_engine(baseline: dict[str, Any], name: str | None, values: list[Any],
                  model: str | None, target: dict[str, Any], server: str | None,
                  workload: Any, out: list[str]) -> None:
    """Knob names, then each variant's EngineConfig built from config.json."""
    from workbench.config import EngineConfig

    knobs = set(engine_knobs())
    extra = set(ROUTER_KNOBS) if server == "router" else set()
    kind = "an engine knob" if not extra else "an engine or router knob"
    for key in sorted(set(baseline) - knobs - extra, key=str):
        out.append(f"baseline.{key} is not {kind}{did_you_mean(key, knobs | extra)}")
    if name is not None and name not in knobs | extra:
        out.append(f"variable.name ({name}) is not {kind}{did_you_mean(name, knobs | extra)}")
        name = None
    if model is None:
        return
    _, args = (_workbench_server(target["command"]) if server else ("", []))
    from_command = _command_knobs(args, server) if server else {}
    seen: set[str] = set()
    plan = [("baseline", baseline)] + ([] if name is None else [
        (_label(name, v), {**baseline, name: v}) for v in values])
    for label, cfg in plan:
        if extra:
            for key in ("policy", "routing_policy"):
                p = cfg.get(key)
                if p is not None and p not in ROUTING_POLICIES:
                    msg = (f"{key} ({p!r}) must be one of {', '.join(ROUTING_POLICIES)}"
                           f"{did_you_mean(p, ROUTING_POLICIES)}")
                    if msg not in seen:
                        seen.add(msg)
                        out.append(f"{label}: {msg}")
        kwargs = {**from_command, **{k: v for k, v in cfg.items()
                                     if k in knobs and k not in extra}}
        if extra and cfg.get("scheduling_policy") is not None:  # the router's name for it
            kwargs["policy"] = cfg["scheduling_policy"]
        try:
            config = EngineConfig.from_kwargs(model, **kwargs)
        except (ValueError, TypeError) as e:
            if str(e) not in seen:  # the baseline's error is not repeated per variant
                seen.add(str(e))
                out.append(f"{label}: {e}")
            continue
        _check_fits(label, config, workload, out, seen)


def _check_fits(label: str, config: Any, workload: Any, out: list[str], seen: set[str]
                ) -> None:
    """The engine refuses a prompt longer than max_model_len: every prompt must fit."""
    if workload is None or not workload.requests:
        return
    longest = max(len(r.prompt_token_ids or ()) for r in workload.requests)
    limit = config.model_config.max_model_len
    if longest > limit:
        msg = (f"the workload's longest prompt ({longest} tokens) is longer than max_model_len "
               f"({limit}); lower workload.params.max_input_len or raise max_model_len")
        if msg not in seen:
            seen.add(msg)
            out.append(f"{label}: {msg}")

"""Secrets kept out of logs, MLflow and results: values of secret-named keys become "***".

A key (a dict key, a flag, an env variable) is secret when its name, split at `_ - .`, holds
`secret`, `password`/`passwd`, `api` then `key` (`api_key`, `--api-key`, `OPENAI_API_KEY`) or
`apikey`, or ends in `token` (`hf_token`, `--hf-token`; not `max_tokens`, not a tokenizer's
`bos_token` / `eos_token` / ...).

    redact({"target": {"api_key": "s3cret"}})       -> {"target": {"api_key": "***"}}
    redact_argv(["serve", "--api-key", "s3cret"])    -> ["serve", "--api-key", "***"]
    redact_text("... --api-key=s3cret ...", {"s3cret"}) -> "... --api-key=*** ..."

`secret_values` collects the secrets of a mapping, so free text that repeats one (a YAML
dump, an error message) is redacted by value too (`redact_text`; values shorter than
`MIN_SECRET_LEN` are not replaced in free text, where they would mangle other words).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

REDACTED = "***"
MIN_SECRET_LEN = 4
_SPECIAL_TOKENS = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask"})
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)")


def is_secret_name(name: str) -> bool:
    """Whether a key, flag or variable named `name` holds a secret (module docstring)."""
    parts = [p for p in re.split(r"[_.\-\s]+", name.strip("-").lower()) if p]
    if not parts:
        return False
    if {"secret", "secrets", "password", "passwd", "apikey"} & set(parts):
        return True
    if any(a == "api" and b == "key" for a, b in zip(parts, parts[1:], strict=False)):
        return True
    return parts[-1] == "token" and not (len(parts) == 2 and parts[0] in _SPECIAL_TOKENS)


def _has_secret(value: Any) -> bool:
    return value is not None and value != "" and value != REDACTED


def redact(value: Any) -> Any:
    """A copy of `value` (dicts, lists, tuples, strings) with the values of secret-named keys
    replaced by REDACTED, and command lines (lists of strings, strings) redacted flag-wise."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_name(k) and _has_secret(v)
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, str) for v in value):
            out: list[Any] = redact_argv(value)
        else:
            out = [redact(v) for v in value]
        return out if isinstance(value, list) else tuple(out)
    if isinstance(value, str):
        return redact_text(value)
    return value


def secret_values(value: Any) -> set[str]:
    """The secrets `value` holds: strings under secret-named keys and after secret flags."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k) and isinstance(v, str | int) \
                    and not isinstance(v, bool) and _has_secret(v):
                found.add(str(v))
            else:
                found |= secret_values(v)
    elif isinstance(value, list | tuple):
        strings = [v for v in value if isinstance(v, str)]
        for i, arg in enumerate(strings):
            flag, eq, rest = arg.partition("=")
            if flag.startswith("-") and is_secret_name(flag):
                if eq and rest:
                    found.add(rest)
                elif not eq and i + 1 < len(strings):
                    found.add(strings[i + 1])
        for v in value:
            if not isinstance(v, str):
                found |= secret_values(v)
    return {s for s in found if s and s != REDACTED}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of every secret flag (`--api-key X`, `--api-key=X`) redacted,
    and that value wherever else it appears (`-c "... X ..."`)."""
    known = secret_values(list(argv))
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, rest = arg.partition("=")
        if flag.startswith("-") and is_secret_name(flag):
            if eq:
                out.append(f"{flag}={REDACTED}" if rest else arg)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg, known) if known else arg)
    return out


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with each of `secrets` (>= MIN_SECRET_LEN chars) and the value after every
    secret flag (`--api-key X`, `--api-key=X`) replaced by REDACTED."""
    for s in sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(s, REDACTED)

    def flag(m: re.Match[str]) -> str:
        return f"{m[1]}{m[2]}{REDACTED}" if is_secret_name(m[1]) else m[0]

    return _FLAG.sub(flag, text) if "-" in text else text

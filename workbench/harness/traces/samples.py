"""Small trace files in each format that the project writes itself (nothing downloaded):
`write_samples(dir)` writes them, `python -m workbench.harness.traces.samples DIR` too. The
shipped copies live in workbench/assets/traces/ (SAMPLES_DIR); a test checks they are what
this module writes. Sized for the bundled CPU models (prompt + output <= 1024 tokens).

    sharegpt_sample.json   16 conversations of WORDS prose; one with a single turn and one
                           with a 2-word reply, so the loader's drops show
    burstgpt_sample.csv    40 rows in bursts over ~60 s, ChatGPT and GPT-4, conversation and
                           API logs; two failed rows (Response tokens 0)
    azure_conv_sample.csv  40 rows over ~20 s, the 2023 date-time format (7 decimals)
    mooncake_sample.jsonl  40 lines over ~30 s, 512-token blocks: every prompt starts with
                           block 0 (a shared system prompt), two thirds of them continue with
                           one of three shared documents (ids 1-3), the rest with their own
"""

from __future__ import annotations

import csv
import json
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

from workbench.harness.workload_base import WORDS

SAMPLES_DIR = Path(__file__).resolve().parents[2] / "assets" / "traces"
FILES = {"sharegpt": "sharegpt_sample.json", "burstgpt": "burstgpt_sample.csv",
         "azure": "azure_conv_sample.csv", "mooncake": "mooncake_sample.jsonl"}


def _prose(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def _times(rng: random.Random, n: int, mean_gap: float) -> list[float]:
    """Bursty arrival times: gamma gaps with shape 0.5 (burstier than Poisson)."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(0.5, mean_gap / 0.5)
    return out


def sharegpt(path: Path) -> None:
    rng = random.Random(1)
    chats: list[list[dict[str, str]]] = []
    for i in range(16):
        turns = [{"from": "human", "value": _prose(rng, 8, 120)},
                 {"from": "gpt", "value": _prose(rng, 10, 150)}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": _prose(rng, 5, 30)},
                      {"from": "gpt", "value": _prose(rng, 5, 60)}]
        chats.append(turns)
    chats[5] = chats[5][:1]  # one turn: dropped
    chats[9][1]["value"] = "Ok."  # too short a reply: dropped
    convs = [{"id": f"sample{i:02d}", "conversations": t} for i, t in enumerate(chats)]
    path.write_text(json.dumps(convs, indent=1) + "\n", encoding="utf-8")


def burstgpt(path: Path) -> None:
    rng = random.Random(2)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type"])
        for i, t in enumerate(_times(rng, 40, 1.5)):
            n_in = rng.randint(16, 400)
            n_out = 0 if i in (7, 23) else rng.randint(8, 160)
            w.writerow([round(t) + 5, rng.choice(["ChatGPT", "ChatGPT", "GPT-4"]), n_in, n_out,
                        n_in + n_out, "API log" if rng.random() < 0.25 else "Conversation log"])


def azure(path: Path) -> None:
    rng = random.Random(3)
    start = datetime(2023, 11, 16, 18, 15, 46)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t in _times(rng, 40, 0.5):
            stamp = start + timedelta(microseconds=round(t * 1e6))
            w.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", rng.randint(24, 700),
                        rng.randint(4, 200)])


def mooncake(path: Path) -> None:
    rng = random.Random(4)
    next_id = 4
    lines = []
    for t in _times(rng, 40, 0.75):
        if rng.random() < 2 / 3:
            second = rng.randint(1, 3)
        else:
            second, next_id = next_id, next_id + 1
        lines.append(json.dumps({"timestamp": round(t * 1000), "input_length":
                                 rng.randint(520, 900), "output_length": rng.randint(8, 64),
                                 "hash_ids": [0, second]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


WRITERS = {"sharegpt": sharegpt, "burstgpt": burstgpt, "azure": azure, "mooncake": mooncake}


def write_samples(directory: str | Path) -> dict[str, Path]:
    """Write the four sample files into `directory` (created); {format: path}."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for fmt, name in FILES.items():
        WRITERS[fmt](d / name)
        out[fmt] = d / name
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m workbench.harness.traces.samples DIR", file=sys.stderr)
        return 2
    for fmt, path in write_samples(argv[0]).items():
        print(f"{fmt}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

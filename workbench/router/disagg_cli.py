"""`workbench disagg ...`: `workbench router` with disaggregated prefill/decode.

    workbench disagg --model DIR                       1 prefill + 1 decode replica
    workbench disagg --num-prefill 2 --num-decode 2 --prefill-policy prefix_aware --model DIR
    workbench disagg --prefill-url URL --decode-url URL --model DIR

The flags are `workbench router`'s (`router/cli.py`); see `router/disagg.py` for the flow.
"""

from __future__ import annotations

from workbench.router.cli import main as router_main


def main(argv: list[str] | None = None) -> None:
    router_main(argv, disaggregated=True)


if __name__ == "__main__":
    main()

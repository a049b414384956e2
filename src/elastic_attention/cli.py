"""Command line: `elastic-attention <command>`. Parses arguments and calls the public API; no logic of its own."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-attention", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run the embedded demo (no download, CPU)")
    demo.add_argument("--seed", type=int, default=0)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if args.command == "demo":
        from elastic_attention.demo import run_demo

        print(run_demo(seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

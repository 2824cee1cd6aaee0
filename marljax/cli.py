"""Command line: `marljax demo [--steps N] [--seed S]`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="marljax", description="JAX-native multi-agent RL for LLM teams")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the embedded demonstration", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from marljax import demo

        return demo.main(rest)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

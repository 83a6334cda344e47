"""Command line: ``python -m glm5_shim doctor | inspect | make-tiny``."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m glm5_shim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="what is patched and what will be used, without touching GPU memory")
    doctor.add_argument("model", nargs="?", help="a GGUF file (first shard) to check as well")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        from glm5_shim.doctor import main as doctor_main

        return doctor_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

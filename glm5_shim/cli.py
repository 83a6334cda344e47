"""Command line: ``python -m glm5_shim doctor | inspect | make-tiny | make-slice``."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m glm5_shim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="what is patched and what will be used, without touching GPU memory")
    doctor.add_argument("model", nargs="?", help="a GGUF file (first shard) to check as well")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")

    from glm5_shim.gguf.fixture import add_make_tiny_arguments
    from glm5_shim.report import add_inspect_arguments
    from glm5_shim.gguf.slice import add_make_slice_arguments

    add_inspect_arguments(sub.add_parser(
        "inspect", help="architecture, config, quant types, validator findings, memory per GPU of a GGUF"))
    add_make_tiny_arguments(sub.add_parser(
        "make-tiny", help="write a small random GLM-5 GGUF (llama.cpp glm-dsa layout) plus its reference weights"))
    add_make_slice_arguments(sub.add_parser(
        "make-slice", help="write a random GLM-5 slice at the real sizes (N layers, a preset's types, one TP rank)"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from glm5_shim.gguf.errors import GGUFError

    try:
        return _run(args)
    except GGUFError as exc:  # bad input: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.command == "doctor":
        from glm5_shim.doctor import main as doctor_main

        return doctor_main(args)
    if args.command == "inspect":
        from glm5_shim.report import run_inspect

        return run_inspect(args)
    if args.command == "make-slice":
        from glm5_shim.gguf.slice import run_make_slice

        return run_make_slice(args)
    assert args.command == "make-tiny", args.command  # argparse accepts only these commands
    from glm5_shim.gguf.fixture import run_make_tiny

    return run_make_tiny(args)


if __name__ == "__main__":
    sys.exit(main())

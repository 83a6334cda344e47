"""bench/e2e.py's command line: `all` (the whole run), `report DIR`, `reference DIR` (the float32 scoring step)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .arms import MODEL_ARGS
from .reference import reference_scores
from .report import report
from .run import run_all
from .summary import summarize


def model_args_json(value: str) -> dict:
    """--model-args: a JSON object of make_tiny keyword arguments (or one per quant: {"Q8_0": {...}})."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r} ({exc})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def main(description: str) -> int:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--models", default="", help="serve DIR/tiny-<quant>.gguf where it exists (e.g. a file "
                   "llama.cpp's own tools wrote: bench/real_gguf.py) instead of generating it; its widths are its own")
    a.add_argument("--model-args", default={}, type=model_args_json,
                   help='extra make_tiny arguments as JSON, for every model or by quant, e.g. \'{"layers": 7, '
                        '"indexer_types": "glm52"}\' (GLM-5.2\'s shared indexers) or \'{"Q4_K": {...}}\'')
    a.add_argument("--tp", type=int, default=1)
    a.add_argument("--heads", type=int, default=MODEL_ARGS["heads"],
                   help="attention heads of the tiny model (GLM-5 has 64: with --tp 8 each rank holds 8)")
    a.add_argument("--arms", default="", help="comma-separated arm names (default: all six)")
    a.add_argument("--dtype", default="", choices=["", "auto", "float16", "bfloat16"],
                   help="--dtype for every server, e.g. float16: what GGUF serving picks on "
                   "compute capability >= 10 (sm_120); FlashMLA (native arms on an H200) is bf16 only")
    a.add_argument("--base-port", type=int, default=8100)
    a.add_argument("--start-timeout", type=float, default=420)
    a.add_argument("--load-seconds", type=float, default=120)
    a.add_argument("--requests-c1", type=int, default=16)
    a.add_argument("--requests-c32", type=int, default=96)
    a.add_argument("--in-len", type=int, default=1024)
    a.add_argument("--out-len", type=int, default=128)
    a.add_argument("--skip-throughput", action="store_true")
    a.add_argument("--throughput-arms", default="", help="comma-separated arms to measure (default: every arm)")
    a.add_argument("--throughput-passes", type=int, default=2,
                   help="measure each arm this many times in a row; the ratio uses the last pass (first-use "
                        "Triton compiles land in the first)")
    a.add_argument("--skip-reference", action="store_true")
    a.add_argument("--budget-s", type=float, default=0,
                   help="seconds from server start: skip remaining throughput runs "
                   "that would leave no time for the load")
    r = sub.add_parser("report")
    r.add_argument("dir")
    f = sub.add_parser("reference", help="score DIR/results.json against the float32 reference → DIR/reference.json")
    f.add_argument("dir")
    args = p.parse_args()
    if args.cmd == "reference":
        results = json.loads((Path(args.dir) / "results.json").read_text())
        models = {q: m["path"] for q, m in results["models"].items()}
        (Path(args.dir) / "reference.json").write_text(json.dumps(reference_scores(results, models)))
        return 0
    if args.cmd == "report":
        results = json.loads((Path(args.dir) / "results.json").read_text())
        summarize(results)
        (Path(args.dir) / "e2e.md").write_text(report(results))
        print(report(results))
        return 0
    return run_all(args)

"""GLM-5 slices at the real sizes served on one GPU through `launch.sh` and the OpenAI API (issue #16).

    python bench/slice_serve.py run --out DIR [--parts a,b,c,d,e,f] [--budget-s 480] [--slice-dir /tmp/slices]
    python bench/slice_serve.py report DIR      rewrite DIR/slice.md from DIR/slice.json
    python bench/slice_serve.py group TRACE     the kernel groups of one torch-profiler trace (JSON)
    python bench/slice_serve.py logprobs A.json B.json   part a of A against part b of B (first-token logprobs)

Slices (`make-slice`, written into --slice-dir on the device; 4 layers: 1 dense + 3 MoE):
    r8-Q4_K_M     Q4_K_M, --rank-of 8: what one rank computes at TP 8 (2.55 GB)
    r8-IQ2_M      UD-IQ2_M-like, --rank-of 8 (1.35 GB; routed experts IQ2_XXS/IQ2_S run on vLLM's ggml kernels)
    full-Q4_K_M   Q4_K_M at full width, served at TP 1 (19.9 GB)
Parts, in priority order (each starts its own server unless the previous part's is the same; a part that would not
finish inside --budget-s is not started, and a step is skipped when the budget is near):
    a  r8-Q4_K_M, shim arm (GLM5_SHIM_ATTENTION=triton GLM5_SHIM_INDEXER=triton), GGUF kernels on: start-up (load
       time and GB/s, engine start-up, GPU memory by component, peak host RSS of the server's process tree), decode
       output tok/s at concurrency 1/8/32/64 with 2k-token prompts, prefill tok/s, first-token log-probabilities,
       a torch-profiler profile of decode steps (concurrency 1 and 32) and prefill chunks grouped per kernel kind
    b  the same slice, native arm (FlashMLA sparse + DeepGEMM): log-probabilities compared with a's (this run's,
       else --logprobs-ref's when its slice has the same bytes), the same throughput and profile
    c  shim arm with GLM5_SHIM_GGUF_KERNELS=vllm (vLLM's GGUF kernels): decode at 1/32, prefill, profile
    d  16k-token prompts on a's server configuration: decode at 1/8/32/64, prefill
    e  r8-IQ2_M, shim arm: start-up, decode at 1/32, prefill, profile
    f  full-Q4_K_M at TP 1, shim arm: start-up, decode, prefill, profile
Decode tok/s is measured in the steady window of a wave (from the last stream's first token to the first stream's
last token: every stream decoding); prefill tok/s from a separate pass of max_tokens=1 requests. Random token-id
prompts, greedy, ignore_eos. The server: --max-model-len 18432, --gpu-memory-utilization 0.90, --max-num-seqs 64,
--max-num-batched-tokens 8192, --no-enable-prefix-caching, CUDA graphs as vLLM chooses, the torch profiler armed
through --profiler-config (it records only between /start_profile and /stop_profile; traces stay in DIR/traces).
DIR/slice.json holds everything (written after every step), DIR/slice.md the tables; `python bench/projection.py
DIR/slice.json` turns the profile into the 78-layer TP 8 projection.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
if str(_BENCH.parent) not in sys.path:
    sys.path.insert(0, str(_BENCH.parent))
if str(_BENCH) not in sys.path:
    sys.path.append(str(_BENCH))

from slice_parts.kernels import group_trace, load_trace  # noqa: E402
from slice_parts.parts import PARTS  # noqa: E402
from slice_parts.report import report  # noqa: E402

# part a measured on the H200 (2026-12-02): part b's log-probabilities are compared with it when a does not run
DEFAULT_LOGPROBS_REF = _BENCH / "results" / "2026-12-02-slice-part-a.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="make the slices, serve, measure")
    r.add_argument("--out", required=True)
    r.add_argument("--parts", default="a,b,c,d,e,f", help=f"comma-separated, run in this order: {','.join(PARTS)}")
    r.add_argument("--budget-s", type=float, default=0, help="start no part (or step) that would end after this")
    r.add_argument("--slice-dir", default="/tmp/slices")
    r.add_argument("--start-timeout", type=float, default=420)
    r.add_argument("--base-port", type=int, default=8400)
    r.add_argument("--profile-concurrency", default="1,32", type=lambda s: [int(x) for x in s.split(",") if x])
    r.add_argument("--resume", action="store_true", help="keep the parts already in DIR/slice.json")
    r.add_argument("--logprobs-ref", default=str(DEFAULT_LOGPROBS_REF),
                   help="a slice.json whose part a (same slice bytes) part b is compared with when part a is not in "
                        "this run ('' for none)")
    rep = sub.add_parser("report", help="rewrite DIR/slice.md from DIR/slice.json")
    rep.add_argument("dir")
    lp = sub.add_parser("logprobs", help="part a of A.json against part b of B.json (first-token log-probabilities)")
    lp.add_argument("a_json")
    lp.add_argument("b_json")
    g = sub.add_parser("group", help="group one trace's kernels")
    g.add_argument("trace")
    args = p.parse_args(argv)
    if args.command == "run":
        unknown = [k for k in args.parts.split(",") if k and k not in PARTS]
        if unknown:
            p.error(f"unknown parts {unknown}; expected some of {','.join(PARTS)}")
        from slice_parts.parts import run

        return run(args)
    if args.command == "report":
        d = Path(args.dir)
        (d / "slice.md").write_text(report(json.loads((d / "slice.json").read_text())))
        print((d / "slice.md").read_text())
        return 0
    if args.command == "logprobs":
        from slice_parts.measure import compare_logprobs
        from slice_parts.parts import same_slice

        a, b = (json.loads(Path(f).read_text()) for f in (args.a_json, args.b_json))
        name = PARTS["a"].slice
        same, why = same_slice(b["slices"][name], a["slices"][name])
        print(f"slices: {why}" + ("" if same else " (not shown the same here: check their tensors before relying "
                                                 "on this comparison)"))
        print(json.dumps(compare_logprobs(a["parts"]["a"]["logprobs"], b["parts"]["b"]["logprobs"]), indent=1))
        return 0
    print(json.dumps(group_trace(load_trace(args.trace)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

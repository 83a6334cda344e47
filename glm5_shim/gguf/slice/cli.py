"""The make-slice command line: `python -m glm5_shim make-slice OUT.gguf --layers N --dense-layers D --preset P`, or
`make-slice OUT.gguf --plain-copy-of SHARED.gguf` (a --shared-data slice written plainly, for llama.cpp)."""
from __future__ import annotations

import argparse
import sys

from ..fixture.tensor_types import PRESETS
from .plan import ORDERS
from .writer import make_slice, write_plain_copy


def add_make_slice_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("out", metavar="OUT.gguf", help="output file")
    parser.add_argument("--layers", type=int, help="decoder layers, without the MTP layer (GLM-5: 78)")
    parser.add_argument("--dense-layers", type=int,
                        help="how many of them (the first) are dense; the rest are MoE (GLM-5: 3)")
    parser.add_argument("--preset", choices=PRESETS,
                        help="per-tensor types: a llama-quantize preset (the types it gives this slice's converted "
                             "file) or UD-IQ2_M-like (an Unsloth-style 2-bit mix; README)")
    parser.add_argument("--mtp", action="store_true", help="add the MTP (nextn) block blk.{layers}")
    parser.add_argument("--peaked", action="store_true",
                        help="with --mtp: a large token embedding, unit final/MTP norms and an identity eh_proj (F16), "
                             "so that greedy decoding follows the embedding and the MTP layer drafts it (speculative "
                             "decoding's speed where a step is GPU time)")
    parser.add_argument("--rank-of", type=int, default=1, metavar="N",
                        help="the model one rank computes at tensor-parallel size N in vLLM 0.23, as a stand-alone "
                             "file (heads, FFN widths and vocabulary divided by N; the rest whole)")
    parser.add_argument("--order", choices=ORDERS, default="auto",
                        help="tensor order: auto (llama-quantize's, which writes preset files), converter, quantize")
    parser.add_argument("--shared-data", action="store_true",
                        help="layers of one kind (same tensor types and shapes) point at one copy of their bytes: a "
                             "78-layer rank-of-8 file of a few GB that loads as the whole model (every layer its own "
                             "GPU tensors); vLLM reads it, llama.cpp does not (--plain-copy-of)")
    parser.add_argument("--plain-copy-of", metavar="SHARED.gguf",
                        help="instead of random weights: write this --shared-data slice again with every tensor's "
                             "own bytes in order (the same model, a file llama.cpp reads); no other option applies")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the blocks")
    parser.add_argument("--quiet", action="store_true", help="no line per tensor")
    return parser


def run_make_slice(args: argparse.Namespace) -> int:
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        if args.plain_copy_of:
            result = write_plain_copy(args.plain_copy_of, args.out, progress=progress)
        else:
            missing = [f"--{k.replace('_', '-')}" for k in ("layers", "dense_layers", "preset")
                       if getattr(args, k) is None]
            if missing:
                raise ValueError(f"make-slice needs {', '.join(missing)} (or --plain-copy-of)")
            result = make_slice(args.out, args.layers, args.dense_layers, args.preset, mtp=args.mtp,
                                rank_of=args.rank_of, order=args.order, seed=args.seed, peaked=args.peaked,
                                shared_data=args.shared_data, progress=progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    return 0

"""End-to-end smoke on a GPU: a tiny GLM-5 GGUF generated on the spot, served by vLLM through the shim.

    python bench/e2e_smoke.py run OUT.json MODEL.gguf [--kv-cache-dtype auto|fp8_ds_mla] [--eager]
        one engine in this process (the shim's switches come from the environment), greedy generation of several
        prompts, longer and shorter than index_topk; writes token ids and top-1 logprobs
    python bench/e2e_smoke.py compare A.json B.json
        agreement table: identical greedy prefix length per prompt, max |logprob difference| over the common prefix
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPT_WORDS = ("the quick brown fox jumps over the lazy dog while glm five reads a long context and keeps the "
                "few tokens its indexer picks ").split()


def prompts() -> list[str]:
    short = "Hello, my name is"
    mid = " ".join(PROMPT_WORDS * 4)  # ~100 tokens: below index_topk 128 (dense regime)
    long = " ".join(PROMPT_WORDS * 24)  # ~600+ tokens: well above index_topk (truly sparse)
    very_long = " ".join(PROMPT_WORDS * 60)
    return [short, mid, long, very_long]


def run(args) -> int:
    from vllm import LLM, SamplingParams

    t0 = time.time()
    kwargs = dict(model=args.model, max_model_len=4096, gpu_memory_utilization=0.5, seed=0,
                  kv_cache_dtype=args.kv_cache_dtype, enforce_eager=args.eager, max_num_seqs=32)
    if not args.eager:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}
    llm = LLM(**kwargs)
    start = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1, ignore_eos=True)
    t1 = time.time()
    outs = llm.generate(prompts(), params)
    gen_s = time.time() - t1
    rows = []
    for o in outs:
        c = o.outputs[0]
        lps = [lp[tid].logprob for tid, lp in zip(c.token_ids, c.logprobs)]
        rows.append({"prompt_tokens": len(o.prompt_token_ids), "ids": list(c.token_ids), "logprobs": lps})
    # a burst of 32 concurrent requests, to run batched decode (and full CUDA graphs when on)
    t2 = time.time()
    burst = llm.generate(prompts() * 8, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    burst_s = time.time() - t2
    burst_ok = all(len(b.outputs[0].token_ids) == 32 for b in burst)
    cfg = llm.llm_engine.vllm_config
    info = {"startup_s": round(start, 1), "generate_s": round(gen_s, 2), "burst32_s": round(burst_s, 2),
            "burst_ok": burst_ok, "env": {k: v for k, v in os.environ.items() if k.startswith("GLM5_SHIM")},
            "kv_cache_dtype": cfg.cache_config.cache_dtype, "dtype": str(cfg.model_config.dtype),
            "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(info, f)
    print(json.dumps({k: v for k, v in info.items() if k != "rows"}))
    return 0


def compare(args) -> int:
    a, b = (json.load(open(p)) for p in (args.a, args.b))
    print(f"| prompt tokens | identical greedy prefix | of | max abs logprob diff (common prefix) |")
    print("|---|---|---|---|")
    for ra, rb in zip(a["rows"], b["rows"]):
        n = 0
        while n < min(len(ra["ids"]), len(rb["ids"])) and ra["ids"][n] == rb["ids"][n]:
            n += 1
        diff = max((abs(x - y) for x, y in zip(ra["logprobs"][:n], rb["logprobs"][:n])), default=0.0)
        print(f"| {ra['prompt_tokens']} | {n} | {len(ra['ids'])} | {diff:.4f} |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("model")
    r.add_argument("--kv-cache-dtype", default="auto")
    r.add_argument("--eager", action="store_true")
    r.add_argument("--max-tokens", type=int, default=48)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    return run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())

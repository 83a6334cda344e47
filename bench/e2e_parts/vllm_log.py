"""What a `vllm serve` log (vLLM 0.23.0) says about start-up: the lines worth keeping and the numbers in them.

The patterns are vLLM 0.23.0's own messages (the source line each comes from is named next to it); bench/long_context.py
and bench/slice_serve.py read server logs with them."""
from __future__ import annotations

import re

KEEP = re.compile(r"Model loading took|KV cache|Maximum concurrency|[Gg]raph capturing|[Mm]emory profiling|"
                  r"non-KV|torch peak|weights memory|init engine|glm5-shim: .*(indexer|top-k)|CUDA out of memory|Error")
NUMBERS = {
    # v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f seconds"
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
    # v1/worker/gpu_worker.py: "Available KV cache memory: %s GiB"
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    # v1/core/kv_cache_utils.py: "GPU KV cache size: %s tokens" (with thousands separators)
    "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    # v1/worker/gpu_model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB"
    "graphs_gib": r"[Gg]raph capturing finished in [\d.]+ secs?, took ([\d.-]+) GiB",
    "graphs_s": r"[Gg]raph capturing finished in ([\d.]+) secs?",
    # v1/engine/core.py: "init engine (profile, create kv cache, warmup model) took %.2f s[ (compilation: %.2f s)]"
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compile_s": r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s \(compilation: ([\d.]+) s",
}


def startup_numbers(text: str) -> dict[str, float]:
    """The last value of every NUMBERS pattern found in a server log (several workers: the last one logged)."""
    out = {}
    for key, pattern in NUMBERS.items():
        found = re.findall(pattern, text)
        if found:
            out[key] = float(found[-1].replace(",", ""))
    if out.get("available_kv_gib") and out.get("kv_tokens"):
        out["kv_bytes_per_token"] = round(out["available_kv_gib"] * 2**30 / out["kv_tokens"], 1)
    return out


def kept_lines(text: str, limit: int = 40) -> list[str]:
    """The start-up lines worth showing (after the logger's prefix), at most `limit`."""
    return [line.split("]", 1)[-1].strip()[:300] for line in text.splitlines() if KEEP.search(line)][:limit]

"""What one running server is asked: decode and prefill throughput, first-token log-probabilities, a profiled
window. Requests go through bench/e2e_parts (stream_one, random_prompt, http_json); prompts are token-id lists."""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import time
from pathlib import Path

from e2e_parts.arms import Arm
from e2e_parts.functional import _ids_and_tops
from e2e_parts.servers import http_json
from e2e_parts.throughput import random_prompt, stream_one

from .kernels import group_trace, load_trace, newest_trace


def decode_window(stamps: list[list[float]], tokens: list[int] | None = None) -> dict:
    """The steady decode rate of a wave of concurrent streams: from the moment the last stream got its first token
    to the moment the first stream got its last one, every stream is decoding; tokens that arrived inside that
    window over its length. Also the per-stream rate (median over streams of (n-1) / (last - first)).

    `tokens` (each stream's completion tokens, from its usage): a chunk may carry several tokens (speculative
    decoding accepts drafts: MTP's steps emit 1 + accepted tokens), so each stream's chunks count tokens / chunks
    each; without it, one token a chunk."""
    weights = [1.0 if not tokens or not tokens[i] else tokens[i] / len(s) for i, s in enumerate(stamps)]
    pairs = [(s, w) for s, w in zip(stamps, weights) if len(s) >= 2]
    if not pairs:
        return {"decode_tok_s": None, "per_stream_tok_s": None, "window_s": 0.0, "window_tokens": 0}
    start = max(s[0] for s, _ in pairs)
    end = min(s[-1] for s, _ in pairs)
    rates = [(w * len(s) - 1) / (s[-1] - s[0]) for s, w in pairs if s[-1] > s[0]]
    per_stream = statistics.median(rates) if rates else None
    if end <= start:
        return {"decode_tok_s": None, "per_stream_tok_s": per_stream and round(per_stream, 2), "window_s": 0.0,
                "window_tokens": 0}
    n = sum(w for s, w in pairs for t in s if start < t <= end)
    return {"decode_tok_s": round(n / (end - start), 1), "per_stream_tok_s": round(per_stream, 2),
            "window_s": round(end - start, 3), "window_tokens": round(n),
            "tokens_per_chunk": round(sum(w for _, w in pairs) / len(pairs), 3)}


async def _wave(arm: Arm, prompts: list[list[int]], max_tokens: int) -> tuple[list[dict], float]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(stream_one(session, arm, p, max_tokens) for p in prompts))
        return rows, time.perf_counter() - t0


def decode(arm: Arm, concurrency: int, in_len: int, out_len: int, vocab: list[int], seed: int = 0) -> dict:
    """One wave of `concurrency` streams (random prompts of in_len tokens, ignore_eos, out_len tokens each) after a
    short warm-up wave at the same concurrency; the steady decode rate (decode_window) and time to first token
    (which, for a wave, includes waiting behind the other streams' prefills)."""
    rng = random.Random(seed * 1000 + concurrency)
    # the warm-up brings this batch size's kernels up (Triton compiles per shape); its prompts need not be long
    asyncio.run(_wave(arm, [random_prompt(rng, vocab, min(in_len, 2048)) for _ in range(concurrency)], 4))
    rows, wall = asyncio.run(_wave(arm, [random_prompt(rng, vocab, in_len) for _ in range(concurrency)], out_len))
    good = [r for r in rows if "error" not in r]
    result = {"concurrency": concurrency, "in_len": in_len, "out_len": out_len, "errors": len(rows) - len(good),
              "wall_s": round(wall, 3), "output_tokens": sum(r["n"] for r in good),
              "ttft_ms_median": round(1e3 * statistics.median(r["ttft"] for r in good), 1) if good else None,
              "ttft_ms_max": round(1e3 * max(r["ttft"] for r in good), 1) if good else None}
    result.update(decode_window([r["stamps"] for r in good], [r.get("n", 0) for r in good]))
    if result["per_stream_tok_s"]:
        result["tpot_ms"] = round(1e3 / result["per_stream_tok_s"], 3)
    if len(good) < len(rows):
        result["first_error"] = next(r["error"] for r in rows if "error" in r)[:300]
    return result


def prefill(arm: Arm, concurrency: int, requests: int, in_len: int, vocab: list[int], seed: int = 0) -> dict:
    """Prefill-only requests (max_tokens=1), `concurrency` at a time: prompt tokens / wall time. The server runs
    without prefix caching, so every prompt is computed."""
    rng = random.Random(seed * 7919 + in_len)

    async def run():
        import aiohttp

        sem = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            async def one(p):
                async with sem:
                    return await stream_one(session, arm, p, 1)
            await asyncio.gather(*(one(random_prompt(rng, vocab, in_len)) for _ in range(min(concurrency, 4))))
            t0 = time.perf_counter()
            rows = await asyncio.gather(*(one(random_prompt(rng, vocab, in_len)) for _ in range(requests)))
            return rows, time.perf_counter() - t0

    rows, wall = asyncio.run(run())
    good = [r for r in rows if "error" not in r]
    return {"concurrency": concurrency, "requests": requests, "in_len": in_len, "errors": len(rows) - len(good),
            "wall_s": round(wall, 3), "prefill_tok_s": round(len(good) * in_len / wall, 1),
            "ttft_ms_median": round(1e3 * statistics.median(r["ttft"] for r in good), 1) if good else None}


def logprob_prompts(vocab: list[int], lengths=(64, 600, 2048, 2048, 4096), seed: int = 99) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, vocab, n) for n in lengths]


def first_token_logprobs(arm: Arm, prompts: list[list[int]]) -> list[dict]:
    """Greedy first token and the top-5 log-probabilities ({token id: logprob}) of every prompt."""
    out = []
    for p in prompts:
        status, body = http_json(arm.base + "/v1/completions",
                                 {"model": arm.model, "prompt": p, "max_tokens": 1, "temperature": 0, "logprobs": 5,
                                  "return_tokens_as_token_ids": True}, timeout=300)
        if status != 200:
            out.append({"error": f"HTTP {status}: {str(body)[:200]}"})
            continue
        lp = body["choices"][0]["logprobs"]
        ids, tops = _ids_and_tops(lp["tokens"], lp["top_logprobs"])
        out.append({"prompt_tokens": len(p), "prompt_sha": prompt_sha(p), "id": ids[0], "top": tops[0]})
    return out


def prompt_sha(ids: list[int]) -> str:
    """A short digest of a token-id prompt: compare_logprobs checks both sides asked the same thing."""
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16]


def compare_logprobs(a: list[dict], b: list[dict]) -> dict:
    """Shim vs native first-token log-probabilities on the same prompts: top-1 agreement, |Δ logprob| of a's top-1
    token (where b lists it), the largest |Δ| over the tokens both list, and a's top-2 gap (a near tie explains a
    top-1 difference). Prompts are matched by position; a pair whose prompts differ (length, or digest where both
    sides have one) is an error row, not a comparison."""
    rows = []
    for x, y in zip(a, b):
        if "error" in x or "error" in y:
            rows.append({"error": x.get("error") or y.get("error")})
            continue
        if x["prompt_tokens"] != y["prompt_tokens"] or (x.get("prompt_sha") and y.get("prompt_sha")
                                                        and x["prompt_sha"] != y["prompt_sha"]):
            rows.append({"error": f"different prompts ({x['prompt_tokens']} tokens {x.get('prompt_sha')} vs "
                                  f"{y['prompt_tokens']} tokens {y.get('prompt_sha')})"})
            continue
        common = set(x["top"]) & set(y["top"])
        deltas = [abs(x["top"][t] - y["top"][t]) for t in common]
        top1 = str(x["id"])
        vals = sorted(x["top"].values(), reverse=True)
        rows.append({"prompt_tokens": x["prompt_tokens"], "same_top1": x["id"] == y["id"],
                     "top1_dlogprob": round(abs(x["top"][top1] - y["top"][top1]), 5) if top1 in y["top"] else None,
                     "max_dlogprob_common": round(max(deltas), 5) if deltas else None, "common_of_5": len(common),
                     "top2_gap": round(vals[0] - vals[1], 5) if len(vals) > 1 else None})
    ok = [r for r in rows if "error" not in r]
    d1 = [r["top1_dlogprob"] for r in ok if r["top1_dlogprob"] is not None]
    return {"rows": rows, "same_top1": sum(r["same_top1"] for r in ok), "of": len(ok), "errors": len(rows) - len(ok),
            "prompts_checked": all(x.get("prompt_sha") for x in a + b),
            "max_top1_dlogprob": max(d1) if d1 else None,
            "max_dlogprob_common": max((r["max_dlogprob_common"] or 0) for r in ok) if ok else None}


async def _post(arm: Arm, path: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async with session.post(arm.base + path) as resp:
            await resp.read()
            return resp.status


def profile_decode(arm: Arm, trace_dir: Path, concurrency: int, in_len: int, vocab: list[int], ttft_s: float,
                   seconds: float, max_tokens: int, trace_wait_s: float = 90) -> dict:
    """Kernels of decode steps at `concurrency`: start `concurrency` long streams, wait until all are decoding
    (1.3 × the time to first token measured at this shape, plus 0.5 s), profile for `seconds`, cancel the streams."""
    rng = random.Random(4242 + concurrency)
    prompts = [random_prompt(rng, vocab, in_len) for _ in range(concurrency)]

    async def run():
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            tasks = [asyncio.ensure_future(stream_one(session, arm, p, max_tokens)) for p in prompts]
            await asyncio.sleep(1.3 * ttft_s + 0.5)
            t_mark = time.time()
            started = await _post(arm, "/start_profile")
            await asyncio.sleep(seconds)
            stopped = await _post(arm, "/stop_profile")
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return started, stopped, t_mark

    started, stopped, t_mark = asyncio.run(run())
    return _grouped(trace_dir, t_mark, {"kind": "decode", "concurrency": concurrency, "in_len": in_len,
                                        "seconds": seconds, "start_status": started, "stop_status": stopped},
                    trace_wait_s)


def profile_prefill(arm: Arm, trace_dir: Path, in_len: int, requests: int, vocab: list[int],
                    trace_wait_s: float = 90) -> dict:
    """Kernels of prefill steps: `requests` prompts of in_len tokens (one chunk each when in_len is at most
    --max-num-batched-tokens), max_tokens=1, one at a time, inside one profiled window."""
    rng = random.Random(777)

    async def run():
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
            t_mark = time.time()
            started = await _post(arm, "/start_profile")
            for _ in range(requests):
                await stream_one(session, arm, random_prompt(rng, vocab, in_len), 1)
            stopped = await _post(arm, "/stop_profile")
            return started, stopped, t_mark

    started, stopped, t_mark = asyncio.run(run())
    return _grouped(trace_dir, t_mark, {"kind": "prefill", "in_len": in_len, "requests": requests,
                                        "start_status": started, "stop_status": stopped}, trace_wait_s)


def _grouped(trace_dir: Path, after: float, info: dict, wait_s: float = 90) -> dict:
    deadline = time.time() + wait_s
    path = None
    while time.time() < deadline:
        path = newest_trace(trace_dir, after)
        if path is not None:
            size = path.stat().st_size
            time.sleep(1.0)
            if path.stat().st_size == size:  # written completely
                break
        time.sleep(1.0)
    if path is None:
        return dict(info, error=f"no trace in {trace_dir} after {wait_s:.0f} s")
    grouped = group_trace(load_trace(path))
    if grouped["kernels"] == 0:
        grouped["warning"] = "the trace has no kernel events (CUPTI saw no CUDA-graph replays?)"
    return dict(info, trace=path.name, trace_mb=round(path.stat().st_size / 1e6, 2), **grouped)

"""Throughput and load over raw streaming HTTP (light on the client): output tokens/s, time to first token, time per
output token; concurrent clients for a while, counting every request."""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time

from .arms import Arm
from .prompts import words
from .servers import http_json
from .summary import percentile99


async def stream_one(session, arm: Arm, prompt_ids: list[int], max_tokens: int) -> dict:
    body = {"model": arm.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, usage, finish = [], None, None
    async with session.post(arm.base + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                # a token may decode to no text yet (a partial character); the chunk still marks its arrival
                if ch.get("text") or (ch.get("finish_reason") and not stamps):
                    stamps.append(time.perf_counter())
                finish = ch.get("finish_reason") or finish
    n = usage["completion_tokens"] if usage else 0
    if not stamps:
        return {"error": "no tokens", "n": n}
    return {"n": n, "ttft": stamps[0] - t0,
            "tpot": (stamps[-1] - stamps[0]) / max(n - 1, 1), "finish": finish, "ok": n == max_tokens,
            "stamps": stamps}  # perf_counter of each chunk that carried a token (bench/slice_serve.py's decode window)


def random_prompt(rng: random.Random, vocab: list[int], length: int) -> list[int]:
    return [rng.choice(vocab) for _ in range(length)]


async def _throughput(arm: Arm, concurrency: int, requests: int, in_len: int, out_len: int, vocab: list[int]):
    import aiohttp

    rng = random.Random(1234)
    work = [random_prompt(rng, vocab, in_len) for _ in range(requests)]
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def run(p):
            async with sem:
                return await stream_one(session, arm, p, out_len)
        # warm-up at this concurrency, so that the timed requests do not start on a cold batch size
        await asyncio.gather(*(stream_one(session, arm, p, 8) for p in work[:concurrency]))
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(run(p) for p in work))
        wall = time.perf_counter() - t0
    good = [r for r in rows if "error" not in r]
    out_tokens = sum(r["n"] for r in good)
    med = lambda xs: statistics.median(xs) if xs else float("nan")
    p99 = lambda xs: percentile99(sorted(xs)) if xs else float("nan")
    return {"concurrency": concurrency, "requests": requests, "in_len": in_len, "out_len": out_len,
            "errors": len(rows) - len(good), "wall_s": round(wall, 3), "output_tok_s": round(out_tokens / wall, 1),
            "input_tok_s": round(len(good) * in_len / wall, 1),
            "ttft_ms_median": round(1e3 * med([r["ttft"] for r in good]), 2),
            "ttft_ms_p99": round(1e3 * p99([r["ttft"] for r in good]), 2),
            "tpot_ms_median": round(1e3 * med([r["tpot"] for r in good]), 3),
            "tpot_ms_p99": round(1e3 * p99([r["tpot"] for r in good]), 3)}


async def _load(arm: Arm, clients: int, seconds: float, vocab: list[int]):
    import aiohttp

    deadline = time.perf_counter() + seconds
    stats = {"sent": 0, "completed": 0, "errors": [], "short": 0, "tokens": 0}

    async def worker(i):
        rng = random.Random(i)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            while time.perf_counter() < deadline:
                n_out = rng.choice((16, 64, 128))
                stats["sent"] += 1
                try:
                    r = await stream_one(session, arm, random_prompt(rng, vocab, rng.randint(200, 2000)), n_out)
                except Exception as exc:  # noqa: BLE001 - a lost request is what this counts
                    stats["errors"].append(repr(exc)[:200])
                    continue
                if "error" in r:
                    stats["errors"].append(r["error"])
                else:
                    stats["completed"] += 1
                    stats["tokens"] += r["n"]
                    stats["short"] += 0 if r["ok"] else 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    stats.update(seconds=round(time.perf_counter() - t0, 1), clients=clients,
                 errors_count=len(stats["errors"]), errors=stats["errors"][:5])
    stats["lost"] = stats["sent"] - stats["completed"]
    return stats


def ordinary_vocab(arm: Arm) -> list[int]:
    """Token ids of plain words (no special tokens): what random prompts are drawn from."""
    status, tok = http_json(arm.base + "/tokenize", {"model": arm.model, "prompt": words(2000, 7),
                                                       "add_special_tokens": False})
    if status != 200:
        raise RuntimeError(f"{arm.name}: /tokenize failed: {tok}")
    return sorted(set(tok["tokens"]))

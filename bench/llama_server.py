"""llama.cpp's own server on a GGUF, at the concurrencies bench/slice_serve.py measures vLLM at (issue #47: the peer on
the same file and GPU).

    python bench/llama_server.py MODEL.gguf --out DIR [--bin /tmp/llamacpp-build/bin/llama-server] [--slots 8]
                                 [--concurrency 1,8] [--in-len 2048] [--out-len 128] [--extra "-fa on"]

Starts `llama-server -m MODEL -ngl 999 -np SLOTS -c SLOTS x (in + out + 64)` (all layers on the GPU, one context
slot a stream), then for each concurrency C sends C requests at once to its native `/completion` endpoint: random
token-id prompts of --in-len ordinary tokens of the file's vocabulary, `n_predict` --out-len, `ignore_eos`, greedy,
after a short warm-up wave.  llama-server reports each request's own timings (prompt and generation ms and tokens):
decode tok/s at C = the sum over the C streams of their generation rates (every stream decodes at once: the prompts
are processed first, one batch), TPOT = the median stream's ms a token, TTFT = the wall time to the first token is not
streamed here, so the prompt ms of the slowest stream is reported.  Counting tokens, not text: the slices' vocabularies
are mostly unused [PAD] tokens, which llama.cpp renders as no text.  DIR/llama_server.json and .md, the server log.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def ordinary_tokens(model: Path) -> list[int]:
    """Token ids of NORMAL type (1) in the GGUF's tokenizer.ggml.token_type."""
    import gguf

    field = gguf.GGUFReader(model).get_field("tokenizer.ggml.token_type")
    types = field.contents()
    ids = [i for i, t in enumerate(types) if t == 1]
    if len(ids) < 100:
        raise SystemExit(f"{model}: only {len(ids)} NORMAL tokens in tokenizer.ggml.token_type")
    return ids


def wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"llama-server not ready after {timeout:.0f} s; see {log}")


async def _one(session, port: int, prompt: list[int], n: int) -> dict:
    body = {"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0, "top_k": 1,
            "cache_prompt": False}
    t0 = time.perf_counter()
    async with session.post(f"http://127.0.0.1:{port}/completion", json=body) as resp:
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
        out = await resp.json()
    t = out.get("timings") or {}
    return {"wall_s": time.perf_counter() - t0, "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
            "predicted_n": t.get("predicted_n"), "predicted_ms": t.get("predicted_ms")}


async def wave(port: int, prompts: list[list[int]], n: int) -> tuple[list[dict], float]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(_one(session, port, p, n) for p in prompts))
        return rows, time.perf_counter() - t0


def measure(port: int, concurrency: int, in_len: int, out_len: int, vocab: list[int]) -> dict:
    rng = random.Random(1000 + concurrency)
    asyncio.run(wave(port, [[rng.choice(vocab) for _ in range(min(in_len, 256))] for _ in range(concurrency)], 4))
    rows, wall = asyncio.run(wave(port, [[rng.choice(vocab) for _ in range(in_len)] for _ in range(concurrency)],
                                  out_len))
    good = [r for r in rows if "error" not in r and r.get("predicted_ms")]
    out = {"concurrency": concurrency, "in_len": in_len, "out_len": out_len, "errors": len(rows) - len(good),
           "wall_s": round(wall, 3)}
    if good:
        rates = [r["predicted_n"] / r["predicted_ms"] * 1e3 for r in good]
        out.update(decode_tok_s=round(sum(rates), 1), per_stream_tok_s=round(statistics.median(rates), 2),
                   tpot_ms=round(1e3 / statistics.median(rates), 3),
                   tokens=sum(r["predicted_n"] for r in good),
                   prompt_ms_max=round(max(r["prompt_ms"] for r in good), 1),
                   prefill_tok_s=round(sum(r["prompt_n"] for r in good) / max(r["prompt_ms"] for r in good) * 1e3, 1))
    if len(good) < len(rows):
        out["first_error"] = next((r.get("error") for r in rows if "error" in r), "no timings")
    return out


def report(res: dict) -> str:
    lines = [f"# llama-server on {res['model']} — {res['date']}", "", f"Command: `{res['server_command']}`", "",
             f"Ready in {res['ready_s']} s.", "",
             "| concurrency | prompt | decode tok/s (sum of streams) | per stream tok/s (TPOT ms) "
             "| prompt ms (slowest) "
             "| prefill tok/s | errors |", "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['concurrency']} | {r['in_len']} | {r.get('decode_tok_s', '-')} | "
                     f"{r.get('per_stream_tok_s', '-')} ({r.get('tpot_ms', '-')}) | {r.get('prompt_ms_max', '-')} | "
                     f"{r.get('prefill_tok_s', '-')} | {r['errors']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--out", required=True)
    p.add_argument("--bin", default="/tmp/llamacpp-build/bin/llama-server")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--in-len", type=int, default=2048)
    p.add_argument("--out-len", type=int, default=128)
    p.add_argument("--port", type=int, default=8480)
    p.add_argument("--extra", default="", help="more llama-server arguments, one string")
    p.add_argument("--start-timeout", type=float, default=300)
    args = p.parse_args(argv)
    model, out = Path(args.model), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    if max(concurrencies) > args.slots:
        p.error(f"--concurrency {max(concurrencies)} needs at least as many --slots ({args.slots})")
    ctx = args.slots * (args.in_len + args.out_len + 64)
    cmd = [args.bin, "-m", str(model), "-ngl", "999", "-np", str(args.slots), "-c", str(ctx), "--port",
           str(args.port), "--host", "127.0.0.1", *args.extra.split()]
    log = out / "llama_server.log"
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    res = {"model": str(model), "date": time.strftime("%Y-%m-%d %H:%M"), "server_command": " ".join(cmd), "rows": []}
    try:
        res["ready_s"] = round(wait_ready(args.port, proc, log, args.start_timeout), 1)
        vocab = ordinary_tokens(model)
        for c in concurrencies:
            res["rows"].append(measure(args.port, c, args.in_len, args.out_len, vocab))
            print(json.dumps(res["rows"][-1]), flush=True)
            (out / "llama_server.json").write_text(json.dumps(res, indent=1))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        (out / "llama_server.json").write_text(json.dumps(res, indent=1))
        if "ready_s" in res:
            (out / "llama_server.md").write_text(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

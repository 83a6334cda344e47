"""End to end on a GPU: serve tiny GLM-5 GGUFs through `launch.sh`, talk to them over the OpenAI API, compare.

    python bench/e2e.py all --out DIR [--tp N] [--arms a,b,...] [--dtype float16] [--load-seconds 120] [--quick]
        one command for the whole check (one device call): writes the tiny models, starts one `vllm serve` per
        arm through launch.sh (all at once, each with its own small KV pool), then
          - functional: completions and chat completions, streaming and not, prompts below and far above
            index_topk; greedy token ids and log-probabilities of every arm;
          - bad requests at the server (too long, empty prompt, malformed chat message) and a good one after;
          - throughput: concurrency 1 and 32, output tokens/s, time to first token, time per output token;
          - load: 32 concurrent streaming clients for --load-seconds, then the same greedy request as before;
        stops the servers, then scores every arm's tokens against a float32 transformers reference of the
        model (teacher-forced on that arm's own tokens). DIR/results.json holds everything; DIR/e2e.md the tables.
    python bench/e2e.py report DIR      rewrite DIR/e2e.md from DIR/results.json

An arm is a model (Q8_0 or Q4_K tiny GGUF) × attention path × KV-cache dtype (the "-bf16" arms keep vLLM's "auto"
cache: the model dtype's 16 bits, fp16 under --dtype float16):
    shim   GLM5_SHIM_ATTENTION=triton GLM5_SHIM_INDEXER=triton  (the code paths SM120 takes)
    native vLLM's own choice on this GPU (FLASHMLA_SPARSE + DeepGEMM on an H200); the shim only loads the GGUF
The tiny models are `make-tiny --peaked` (see glm5_shim/gguf/fixture.py: random weights whose next-token
choice is not chaotic, so that two correct engines can be compared token by token).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script from a checkout: the package is the one next to it
LAUNCH = Path(os.environ.get("GLM5_E2E_LAUNCH", REPO / "launch.sh"))  # tests swap in a stand-in server
SHIM_ENV = {"GLM5_SHIM_ATTENTION": "triton", "GLM5_SHIM_INDEXER": "triton"}
MODEL_ARGS = dict(layers=3, heads=16, index_heads=32, index_topk=128)  # heads 16: 8 a rank at TP 2
MAX_MODEL_LEN = 4096
GEN_TOKENS = 48


@dataclass
class Arm:
    name: str
    quant: str
    kv: str  # auto | fp8_ds_mla
    path: str  # shim | native
    port: int = 0
    proc: subprocess.Popen | None = None
    log: Path | None = None
    model: str = ""
    startup_s: float = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_SHIM_")}
        if self.path == "shim":
            env.update(SHIM_ENV)
        return env


def all_arms() -> list[Arm]:
    arms = []
    for quant, kv in (("Q8_0", "auto"), ("Q8_0", "fp8_ds_mla"), ("Q4_K", "auto")):
        for path in ("shim", "native"):
            tag = f"{quant.lower().replace('_', '')}-{'bf16' if kv == 'auto' else 'fp8'}"
            arms.append(Arm(f"{path}-{tag}", quant, kv, path))
    return arms


# --- prompts -------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _corpus_words() -> list[str]:
    from glm5_shim.gguf._tiny_corpus import TINY_CORPUS

    return sorted({w for w in TINY_CORPUS.split() if w.isalpha()})


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_corpus_words()) for _ in range(n))


@lru_cache(maxsize=1)
def prompts() -> dict[str, str]:
    """Below index_topk (128) and far above it, so that attention is dense for some and truly sparse for most."""
    return {"short": "Hello, my name is", "below_topk": words(40, 1), "sparse_600": words(450, 2),
            "sparse_1500": words(1100, 3), "sparse_3000": words(2200, 4)}


CHAT = [{"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": words(250, 5)}]


# --- servers -------------------------------------------------------------------------------------------

def start(arm: Arm, models: dict[str, str], out: Path, tp: int, dtype: str = "") -> None:
    arm.model = models[arm.quant]
    arm.log = out / f"server_{arm.name}.log"
    cmd = ["bash", str(LAUNCH), arm.model, "--port", str(arm.port), "--max-model-len", str(MAX_MODEL_LEN),
           "--kv-cache-dtype", arm.kv, "--seed", "0", "--max-num-seqs", "64",
           # several servers share one GPU: each takes a fixed KV pool instead of a share of free memory
           "--gpu-memory-utilization", "0.05", "--kv-cache-memory-bytes", str(1 << 30),
           "--tensor-parallel-size", str(tp)] + (["--dtype", dtype] if dtype else [])
    arm.startup_s = time.time()
    arm.proc = subprocess.Popen(cmd, stdout=open(arm.log, "w"), stderr=subprocess.STDOUT, env=arm.env(),
                                start_new_session=True, cwd=str(REPO))


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")[:500]}


def wait_ready(arm: Arm, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if arm.proc.poll() is not None:
            tail = arm.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{arm.name}: server exited with {arm.proc.returncode}:\n{tail}")
        try:
            if http_json(arm.base + "/health", timeout=2)[0] == 200:
                arm.startup_s = round(time.time() - arm.startup_s, 1)
                return
        except (OSError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"{arm.name}: not ready after {timeout:.0f} s; see {arm.log}")


def stop(arm: Arm) -> None:
    if arm.proc is None or arm.proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(arm.proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            arm.proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def alive(arm: Arm) -> bool:
    try:
        return arm.proc.poll() is None and http_json(arm.base + "/health", timeout=5)[0] == 200
    except OSError:
        return False


# --- functional: completions and chat over the openai client --------------------------------------------

def client(arm: Arm):
    from openai import OpenAI

    return OpenAI(base_url=arm.base + "/v1", api_key="none", timeout=120, max_retries=0)


def _ids_and_tops(logprob_tokens, logprob_tops) -> tuple[list[int], list[dict]]:
    ids = [int(t.split(":", 1)[1]) for t in logprob_tokens]
    tops = [{k.split(":", 1)[1]: v for k, v in (t or {}).items()} for t in logprob_tops]
    return ids, tops


def greedy(arm: Arm, prompt: str, max_tokens: int = GEN_TOKENS, salt: str | None = None) -> dict:
    """Greedy completion with per-token log-probabilities, token ids and the prompt's own log-probabilities."""
    c = client(arm)
    extra = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True, "prompt_logprobs": 1}
    if salt:
        extra["cache_salt"] = salt
    r = c.completions.create(model=arm.model, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=5,
                             extra_body=extra)
    ch = r.choices[0]
    d = ch.model_dump() if hasattr(ch, "model_dump") else dict(ch)
    prompt_lp = []
    for pos, entry in enumerate(d.get("prompt_logprobs") or []):
        if entry is None:
            prompt_lp.append(None)
            continue
        tok = d["prompt_token_ids"][pos]
        lp = entry.get(str(tok), entry.get(tok))
        prompt_lp.append(None if lp is None else lp["logprob"])
    _, top = _ids_and_tops(ch.logprobs.tokens, ch.logprobs.top_logprobs)
    return {"prompt_ids": d["prompt_token_ids"], "ids": d["token_ids"], "text": ch.text,
            "logprobs": list(ch.logprobs.token_logprobs), "top": top,
            "prompt_logprobs": prompt_lp, "finish_reason": ch.finish_reason}


NEAR_TIE = 0.1  # nats: where the top two candidates are closer than this, either token is a right answer


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def top2_gap(top: dict) -> float:
    v = sorted(top.values(), reverse=True)
    return v[0] - v[1] if len(v) > 1 else float("inf")


def same_answer(before: dict, after_ids: list[int], after_top: list[dict] | None = None) -> dict:
    """Is `after_ids` the answer `before` gave?  Identical tokens, or the first different token comes at a near-tie
    (top-2 gap < NEAR_TIE nats in either run): two correct engines, or one engine run twice with a different batch
    shape, may resolve a near-tie either way (vLLM's GGUF matmuls and indexer top-k are not batch-invariant)."""
    ids = before["ids"]
    n = common_prefix(ids, after_ids)
    if n == len(ids) == len(after_ids):
        return {"same": True, "identical": n, "of": len(ids)}
    if n >= min(len(ids), len(after_ids)):
        return {"same": False, "identical": n, "of": len(ids), "why": "length differs"}
    gap = top2_gap(before["top"][n])
    if after_top and n < len(after_top):
        gap = min(gap, top2_gap(after_top[n]))
    return {"same": gap < NEAR_TIE, "identical": n, "of": len(ids), "gap_at_divergence": round(gap, 4)}




def functional(arm: Arm) -> dict:
    res: dict = {"greedy": {}, "checks": {}, "compare": {}}
    for name, text in prompts().items():
        res["greedy"][name] = greedy(arm, text)
    c = client(arm)
    # streaming completion: the same tokens as the non-streaming one (token ids through the stream's logprobs)
    long = prompts()["sparse_1500"]
    tokens, tops = [], []
    for ch in c.completions.create(model=arm.model, prompt=long, max_tokens=GEN_TOKENS, temperature=0, stream=True,
                                   logprobs=2, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}):
        if ch.choices and ch.choices[0].logprobs:
            tokens += ch.choices[0].logprobs.tokens
            tops += ch.choices[0].logprobs.top_logprobs
    ids, tops = _ids_and_tops(tokens, tops)
    res["compare"]["completion_stream"] = same_answer(res["greedy"]["sparse_1500"], ids, tops)
    res["checks"]["completion_stream_same_answer"] = res["compare"]["completion_stream"]["same"]
    # chat: the GGUF's chat template; streaming and not give the same answer
    kw = dict(model=arm.model, messages=CHAT, max_tokens=GEN_TOKENS, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"return_tokens_as_token_ids": True})
    chat = c.chat.completions.create(**kw)
    content = chat.choices[0].logprobs.content
    chat_ids, chat_tops = _ids_and_tops([t.token for t in content],
                                        [{x.token: x.logprob for x in t.top_logprobs} for t in content])
    s_tokens, s_tops = [], []
    for ch in c.chat.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            for t in ch.choices[0].logprobs.content:
                s_tokens.append(t.token)
                s_tops.append({x.token: x.logprob for x in t.top_logprobs})
    s_ids, s_tops = _ids_and_tops(s_tokens, s_tops)
    res["chat"] = {"content": chat.choices[0].message.content, "finish_reason": chat.choices[0].finish_reason,
                   "prompt_tokens": chat.usage.prompt_tokens, "completion_tokens": chat.usage.completion_tokens,
                   "ids": chat_ids}
    res["compare"]["chat_stream"] = same_answer({"ids": chat_ids, "top": chat_tops}, s_ids, s_tops)
    res["checks"]["chat_stream_same_answer"] = res["compare"]["chat_stream"]["same"]
    res["checks"]["chat_nonempty"] = bool(chat.choices[0].message.content) and chat.usage.completion_tokens > 0
    # the template was applied: the chat prompt is the rendered template's tokens
    status, tok = http_json(arm.base + "/tokenize", {"model": arm.model, "messages": CHAT,
                                                       "add_generation_prompt": True})
    res["checks"]["chat_template_tokens_match"] = status == 200 and tok.get("count") == chat.usage.prompt_tokens
    return res


def repeatability(arm: Arm, runs: int = 4) -> dict:
    """The same greedy request `runs` times, each with its own cache_salt (no prefix-cache reuse): how many
    different answers, and where they part."""
    out = {}
    for name in ("sparse_600", "sparse_1500"):
        first = None
        distinct, worst = set(), None
        for i in range(runs):
            g = greedy(arm, prompts()[name], salt=f"rep-{i}-{time.time()}")
            distinct.add(tuple(g["ids"]))
            if first is None:
                first = g
            else:
                cmp = same_answer(first, g["ids"], g["top"])
                if worst is None or cmp["identical"] < worst["identical"]:
                    worst = cmp
        out[name] = {"runs": runs, "distinct_answers": len(distinct), "worst": worst}
    return out


def bad_requests(arm: Arm, reference: dict) -> dict:
    """vLLM's normal error response for bad input; the server stays up; the next request answers right."""
    url, chat_url = arm.base + "/v1/completions", arm.base + "/v1/chat/completions"
    cases = {
        "longer_than_max_model_len": (url, {"model": arm.model, "prompt": words(MAX_MODEL_LEN * 2, 9),
                                            "max_tokens": 8}),
        "empty_prompt": (url, {"model": arm.model, "prompt": "", "max_tokens": 8}),
        "negative_max_tokens": (url, {"model": arm.model, "prompt": "hi", "max_tokens": -1}),
        "chat_messages_not_a_list": (chat_url, {"model": arm.model, "messages": "hello", "max_tokens": 8}),
        "chat_message_without_role": (chat_url, {"model": arm.model, "messages": [{"content": "hi"}],
                                                 "max_tokens": 8}),
        "chat_content_not_text": (chat_url, {"model": arm.model, "messages": [{"role": "user", "content": 5}],
                                             "max_tokens": 8}),
    }
    out = {}
    for name, (u, body) in cases.items():
        status, payload = http_json(u, body)
        err = payload.get("error", payload)
        message = str(err.get("message", err) if isinstance(err, dict) else err)
        out[name] = {"status": status, "message": " ".join(message.split())[:200], "alive_after": alive(arm)}
    again = greedy(arm, prompts()["sparse_600"])
    out["next_request"] = same_answer(reference, again["ids"], again["top"])
    out["next_request_same_tokens"] = out["next_request"]["same"]
    return out


# --- throughput and load (raw streaming HTTP, light on the client) --------------------------------------

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
            "tpot": (stamps[-1] - stamps[0]) / max(n - 1, 1), "finish": finish, "ok": n == max_tokens}


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


# --- float32 reference (transformers) -------------------------------------------------------------------

def reference_scores(results: dict, models: dict[str, str]) -> dict:
    """Teacher-forced float32 log-probabilities of every arm's own tokens; |served - reference| per position."""
    import torch
    from transformers import GlmMoeDsaForCausalLM

    from glm5_shim.gguf.fixture import reference_dir

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {}
    for quant, gguf_path in models.items():
        model = GlmMoeDsaForCausalLM.from_pretrained(str(reference_dir(gguf_path)), dtype=torch.float32,
                                                     attn_implementation="eager").to(device).eval()
        for arm_name, arm_res in results["arms"].items():
            if arm_res.get("quant") != quant or "functional" not in arm_res:
                continue
            per_prompt = {}
            for pname, g in arm_res["functional"]["greedy"].items():
                ids = g["prompt_ids"] + g["ids"]
                with torch.no_grad():
                    lp = model(torch.tensor([ids], device=device)).logits[0].float().log_softmax(-1).cpu()
                n_p = len(g["prompt_ids"])
                gen_pos = range(n_p - 1, len(ids) - 1)  # logits at t predict token t+1
                ref_gen = [lp[t, ids[t + 1]].item() for t in gen_pos]
                top2 = [lp[t].topk(2) for t in gen_pos]
                ref_top1 = [int(k.indices[0]) for k in top2]
                dec = [abs(a - b) for a, b in zip(g["logprobs"], ref_gen)]
                pre = [abs(g["prompt_logprobs"][t + 1] - lp[t, ids[t + 1]].item())
                       for t in range(n_p - 1) if g["prompt_logprobs"][t + 1] is not None]
                top1_margin = [float(k.values[0] - k.values[1]) for k in top2]
                per_prompt[pname] = {
                    "decode_abs_diff": dec, "prefill_abs_diff": pre,
                    "top1_agree": sum(a == b for a, b in zip(g["ids"], ref_top1)), "positions": len(g["ids"]),
                    "min_ref_margin": min(top1_margin)}
            out[arm_name] = per_prompt
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


# --- summaries ------------------------------------------------------------------------------------------

def percentile99(sorted_xs: list[float]) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(0.99 * len(sorted_xs)))]


def quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"median": None, "mean": None, "p99": None, "max": None, "over_0.25": 0, "n": 0}
    s = sorted(xs)
    return {"median": round(statistics.median(s), 4), "mean": round(statistics.fmean(s), 4),
            "p99": round(percentile99(s), 4), "max": round(s[-1], 4),
            "over_0.25": sum(x > 0.25 for x in s), "n": len(s)}


def greedy_agreement(a: dict, b: dict) -> dict:
    """Per prompt: identical greedy prefix length and |Δ log-prob| of the chosen token over that prefix."""
    rows = {}
    for name in a:
        ia, ib = a[name]["ids"], b[name]["ids"]
        n = common_prefix(ia, ib)
        diffs = [abs(x - y) for x, y in zip(a[name]["logprobs"][:n], b[name]["logprobs"][:n])]
        gap = None
        if n < min(len(ia), len(ib)) and "top" in a[name] and "top" in b[name]:
            gap = round(min(top2_gap(a[name]["top"][n]), top2_gap(b[name]["top"][n])), 4)
        rows[name] = {"prompt_tokens": len(a[name]["prompt_ids"]), "identical": n, "of": len(ia),
                      "max_abs_dlogprob": round(max(diffs), 4) if diffs else None,
                      "median_abs_dlogprob": round(statistics.median(diffs), 4) if diffs else None,
                      "gap_at_divergence": gap}
    return rows


def shim_native_pairs(names) -> list[tuple[str, str, str]]:
    """(tag, shim arm, native arm) for every tag both paths have among `names`: shim-q80-bf16 ↔ native-q80-bf16."""
    names = set(names)
    return [(n[len("shim-"):], n, "native-" + n[len("shim-"):]) for n in sorted(names)
            if n.startswith("shim-") and "native-" + n[len("shim-"):] in names]


def summarize(results: dict) -> None:
    arms = results["arms"]
    served = [n for n, res in arms.items() if "functional" in res]
    results["agreement"] = {tag: greedy_agreement(arms[s]["functional"]["greedy"], arms[n]["functional"]["greedy"])
                            for tag, s, n in shim_native_pairs(served)}
    ref = results.get("reference", {})
    results["reference_summary"] = {
        arm: {"decode": quantiles([d for p in per.values() for d in p["decode_abs_diff"]]),
              "prefill": quantiles([d for p in per.values() for d in p["prefill_abs_diff"]]),
              "top1_agree": sum(p["top1_agree"] for p in per.values()),
              "positions": sum(p["positions"] for p in per.values())}
        for arm, per in ref.items()}
    # output tokens/s per arm and shape: the mean over the warm passes (2..N; the first pass of a fresh machine pays
    # Triton's first-use compiles), or the only pass there is
    tp: dict = {}
    for name, res in arms.items():
        by_key: dict = {}
        for row in res.get("throughput", []):
            key = row["concurrency"] if row.get("pass") != "split" else f"32 ({row['in_len']}/{row['out_len']})"
            by_key.setdefault(key, []).append(row)
        for key, rows in by_key.items():
            warm = [r for r in rows if r.get("pass") not in (1, None)] or rows
            tp.setdefault(name, {})[key] = statistics.fmean(r["output_tok_s"] for r in warm)
    results["throughput_ratio"] = {tag: {c: round(tp[s][c] / tp[n][c], 3) for c in tp[s] if tp[n].get(c)}
                                   for tag, s, n in shim_native_pairs(tp)}


def report(results: dict) -> str:
    lines = [f"# End to end — {results.get('date', '')} — {results.get('gpu', '')}, "
             f"tensor parallel {results.get('tp')}",
             "", f"Command: `{results.get('command', '')}`", ""]
    lines += ["## Servers", "", "| arm | model | KV cache | attention / indexer | start-up s | checks |",
              "|---|---|---|---|---|---|"]
    for name, res in results["arms"].items():
        checks = res.get("functional", {}).get("checks", {})
        ok = ("all pass" if checks and all(checks.values())
              else ", ".join(k for k, v in checks.items() if not v) or res.get("error", "-"))
        lines.append(f"| {name} | {res.get('quant')} | {res.get('kv')} | {res.get('backends', '-')} | "
                     f"{res.get('startup_s', '-')} | {ok} |")
    lines += ["", "## Greedy agreement, shim-forced vs native (identical greedy tokens of "
              f"{GEN_TOKENS}; |Δ log-prob| of the chosen token over the identical prefix)", ""]
    for tag, rows in results.get("agreement", {}).items():
        lines += [f"### {tag}", "",
                  "| prompt | prompt tokens | identical | max |Δ lp| | median |Δ lp| | top-2 gap where they part |",
                  "|---|---|---|---|---|---|"]
        for pname, r in rows.items():
            lines.append(f"| {pname} | {r['prompt_tokens']} | {r['identical']}/{r['of']} | {r['max_abs_dlogprob']} | "
                         f"{r['median_abs_dlogprob']} | "
                         f"{r.get('gap_at_divergence') if r.get('gap_at_divergence') is not None else '-'} |")
        lines.append("")
    if results.get("reference_error"):
        lines += ["## Float32 reference: failed", "", "```", results["reference_error"][-800:], "```", ""]
    reps = {n: r["repeatability"] for n, r in results["arms"].items() if "repeatability" in r}
    if reps:
        lines += ["## Repeatability (the same greedy request 4 times, each with its own cache_salt)", "",
                  "| arm | prompt | different answers | first divergence (token, top-2 gap) |", "|---|---|---|---|"]
        for n, r in reps.items():
            for pname, v in r.items():
                w = v.get("worst") or {}
                where = ("-" if w.get("same") and w.get("identical") == w.get("of")
                         else f"{w.get('identical')}, {w.get('gap_at_divergence')}")
                lines.append(f"| {n} | {pname} | {v['distinct_answers']} of {v['runs']} | {where} |")
        lines.append("")
    if results.get("reference_summary"):
        lines += ["## Against the float32 reference (transformers GlmMoeDsaForCausalLM on the GGUF's dequantized "
                  "weights, teacher-forced on each arm's own tokens)", "",
                  "| arm | decode |Δ lp| mean / median / p99 / max, # > 0.25 of n "
                  "| prefill |Δ lp| mean / median / p99 / max, # > 0.25 of n | greedy = reference top-1 |",
                  "|---|---|---|---|"]
        for arm, s in results["reference_summary"].items():
            d, p = s["decode"], s["prefill"]
            lines.append(f"| {arm} | {d['mean']} / {d['median']} / {d['p99']} / {d['max']}, "
                         f"{d['over_0.25']} of {d['n']} | "
                         f"{p['mean']} / {p['median']} / {p['p99']} / {p['max']}, {p['over_0.25']} of {p['n']} | "
                         f"{s['top1_agree']}/{s['positions']} |")
        lines.append("")
    tp_rows = [(n, r) for n, res in results["arms"].items() for r in res.get("throughput", [])]
    if tp_rows:
        lines += ["## Throughput (streaming completions, greedy, ignore_eos)", "",
                  "| arm | concurrency | requests | in / out tokens | output tok/s | prompt tok/s "
                  "| TTFT ms median / p99 | TPOT ms median / p99 | errors |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for n, r in tp_rows:
            lines.append(f"| {n} (pass {r.get('pass', 1)}) | {r['concurrency']} | {r['requests']} | "
                         f"{r['in_len']} / {r['out_len']} | {r['output_tok_s']} | {r.get('input_tok_s', '-')} | "
                         f"{r['ttft_ms_median']} / {r['ttft_ms_p99']} | {r['tpot_ms_median']} / {r['tpot_ms_p99']} | "
                         f"{r['errors']} |")
        lines += ["", "shim / native output tokens/s (mean over passes 2..N where there are several): " + "; ".join(
            f"{tag}: " + ", ".join(f"c={c} {v}×" for c, v in r.items())
            for tag, r in results.get("throughput_ratio", {}).items()), ""]
    for name, res in results["arms"].items():
        if "load" in res:
            ld = res["load"]
            lines += [f"## Load on {name}", "",
                      f"{ld['clients']} concurrent streaming clients for {ld['seconds']} s, prompts 200–2000 tokens "
                      f"(index_topk 128), 16/64/128 output tokens: sent {ld['sent']}, completed {ld['completed']}, "
                      f"lost {ld['lost']}, errors {ld['errors_count']}, short {ld['short']}, "
                      f"output tokens {ld['tokens']}; "
                      f"after the load the same greedy requests give the same answers as before: "
                      f"{res.get('after_load_same_tokens')} "
                      f"({res.get('after_load')})", ""]
        if "bad_requests" in res:
            lines += [f"## Bad requests on {name}", "", "| request | HTTP status | message | server alive after |",
                      "|---|---|---|---|"]
            for k, v in res["bad_requests"].items():
                if isinstance(v, dict) and "status" in v:
                    lines.append(f"| {k} | {v['status']} | {v['message'][:90].replace('|', '/')} | "
                                 f"{v['alive_after']} |")
            lines += ["", "next good request gives the same answer as before: "
                          f"{res['bad_requests'].get('next_request')}", ""]
    return "\n".join(lines) + "\n"


# --- the run --------------------------------------------------------------------------------------------

def backends_from_log(log: Path) -> str:
    """What the server says it chose (attention backend, indexer path), from its own log lines."""
    text = log.read_text(errors="replace") if log and log.exists() else ""
    found = [line.split("]", 1)[-1].strip()[:140] for line in text.splitlines()
             if "glm5-shim: using" in line or "glm5-shim: DSA indexer" in line
             or " backend." in line and "Using " in line]
    return " / ".join(dict.fromkeys(found)) or "-"


def run_all(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in all_arms() if not args.arms or a.name in args.arms.split(",")]
    quants = sorted({a.quant for a in arms})
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "tp": args.tp, "command": " ".join(sys.argv),
               "gpu": gpu_name(), "arms": {a.name: {"quant": a.quant, "kv": a.kv, "path": a.path} for a in arms}}
    save = lambda: (out / "results.json").write_text(json.dumps(results, indent=1))
    from glm5_shim.gguf.fixture import PEAKED, make_tiny, reference_dir, write_dequantized_reference

    model_args = dict(MODEL_ARGS, heads=args.heads)
    if model_args["heads"] % args.tp:
        raise SystemExit(f"--heads {args.heads} is not divisible by --tp {args.tp}")
    if args.tp > 1:
        # every down projection must split into whole Q4_K blocks (256 values) on every rank (gguf/tp_split.py)
        model_args.update(intermediate=max(512, 256 * args.tp), moe_intermediate=256 * args.tp)
    extra = args.model_args
    per_quant = bool(extra) and set(extra) <= {"Q8_0", "Q4_K"}
    models = {}
    for q in quants:
        given = Path(args.models) / f"tiny-{q}.gguf" if args.models else None
        if given is not None and given.is_file():
            # a file written elsewhere (e.g. by llama.cpp's own tools: bench/real_gguf.py); the float32 reference is
            # what it stores
            path = given
            if not (reference_dir(path) / "model.safetensors").is_file():
                write_dequantized_reference(path, like=reference_dir(path))
        else:
            path = out / "models" / f"tiny-{q}.gguf"
            make_tiny(path, quant=q, reference="dequantized",
                      **{**model_args, **PEAKED, **(extra.get(q, {}) if per_quant else extra)})
        models[q] = str(path)
    results["models"] = {q: dict(path=p, **({"given": True} if args.models and Path(p).parent == Path(args.models)
                                            else {**model_args, **PEAKED, **(extra.get(q, {}) if per_quant
                                                                              else extra)}))
                         for q, p in models.items()}
    for i, arm in enumerate(arms):
        arm.port = args.base_port + i
        start(arm, models, out, args.tp, args.dtype)
    reference = None
    t_start = time.time()
    try:
        ready = []
        for arm in arms:
            try:
                wait_ready(arm, args.start_timeout)
                ready.append(arm)
                results["arms"][arm.name].update(startup_s=arm.startup_s, backends=backends_from_log(arm.log))
            except RuntimeError as exc:
                results["arms"][arm.name]["error"] = str(exc)[-1500:]
                print(f"[e2e] {exc}", flush=True)
        save()
        print(f"[e2e] ready: {[a.name for a in ready]}", flush=True)

        def on_every_arm(step, key, error_key):
            """Run step(arm) on every ready arm at once; a failure is recorded and the other arms go on."""
            def one(arm):
                try:
                    results["arms"][arm.name][key] = step(arm)
                except Exception as exc:  # noqa: BLE001
                    results["arms"][arm.name][error_key] = f"{key}: {exc!r}"[:1500]
            with ThreadPoolExecutor(len(ready) or 1) as pool:
                list(pool.map(one, ready))

        on_every_arm(functional, "functional", "error")
        on_every_arm(repeatability, "repeatability", "repeatability_error")
        save()
        print("[e2e] functional done", flush=True)

        primary = next((a for a in ready if a.path == "shim" and "functional" in results["arms"][a.name]), None)
        if primary is not None:
            ref = results["arms"][primary.name]["functional"]["greedy"]["sparse_600"]
            results["arms"][primary.name]["bad_requests"] = bad_requests(primary, ref)
            save()
        vocab = ordinary_vocab(ready[0]) if ready else []
        if not args.skip_throughput:
            # passes interleave the arms (shim, native, shim, native...) so that drift on the machine hits both
            tp_arms = [a for a in ready if not args.throughput_arms or a.name in args.throughput_arms.split(",")]
            rows = {a.name: [] for a in tp_arms}
            shapes = [(1, args.requests_c1, args.in_len, args.out_len),
                      (32, args.requests_c32, args.in_len, args.out_len)]
            # where the time goes at concurrency 32: prefill alone (1 output token), decode-heavy (short prompts)
            split = [(32, args.requests_c32, args.in_len, 1), (32, args.requests_c32, 64, 256)]
            for rep_i in [*range(1, args.throughput_passes + 1), "split"]:
                for arm in tp_arms:
                    if args.budget_s and time.time() - t_start + args.load_seconds + 90 > args.budget_s:
                        results["arms"][arm.name]["throughput_skipped"] = f"time budget (pass {rep_i})"
                        continue
                    for conc, n, in_len, out_len in (split if rep_i == "split" else shapes):
                        row = asyncio.run(_throughput(arm, conc, n, in_len, out_len, vocab))
                        row["pass"] = rep_i
                        rows[arm.name].append(row)
                        print(f"[e2e] throughput {arm.name} pass {rep_i} c={conc} {in_len}/{out_len}: {row}",
                              flush=True)
                    results["arms"][arm.name]["throughput"] = rows[arm.name]
                    save()
        # the float32 reference runs in another process during the load (the GPU has room for both; the load
        # checks correctness and loss, not speed)
        if not args.skip_reference:
            save()
            reference = subprocess.Popen([sys.executable, __file__, "reference", str(out)],
                                         stdout=open(out / "reference.log", "w"), stderr=subprocess.STDOUT)
        if primary is not None and args.load_seconds > 0:
            results["arms"][primary.name]["load"] = asyncio.run(_load(primary, 32, args.load_seconds, vocab))
            before = results["arms"][primary.name]["functional"]["greedy"]
            after = {}
            for name in ("short", "sparse_600", "sparse_3000"):
                g = greedy(primary, prompts()[name])
                after[name] = same_answer(before[name], g["ids"], g["top"])
            results["arms"][primary.name]["after_load"] = after
            results["arms"][primary.name]["after_load_same_tokens"] = all(v["same"] for v in after.values())
            results["arms"][primary.name]["alive_after_load"] = alive(primary)
            print(f"[e2e] load: {results['arms'][primary.name]['load']}", flush=True)
            save()
    finally:
        for arm in arms:
            stop(arm)
    if reference is not None:
        reference.wait()
        ref_file = out / "reference.json"
        if ref_file.exists():
            results["reference"] = json.loads(ref_file.read_text())
        else:
            results["reference_error"] = (out / "reference.log").read_text(errors="replace")[-1500:]
    summarize(results)
    save()
    (out / "e2e.md").write_text(report(results))
    print(report(results), flush=True)
    return 0


def model_args_json(value: str) -> dict:
    """--model-args: a JSON object of make_tiny keyword arguments (or one per quant: {"Q8_0": {...}})."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r} ({exc})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip().replace("\n", " + ")
    except (OSError, subprocess.SubprocessError):
        return "no GPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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


if __name__ == "__main__":
    sys.exit(main())

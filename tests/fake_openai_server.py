"""A stand-in for `vllm serve` on a CPU machine: the endpoints and response shapes bench/e2e.py relies on.

It answers like vLLM 0.23's OpenAI server (field names, SSE framing, error objects with HTTP 400) for a toy
"model" whose next token is (last token * 31 + 7) mod VOCAB, so that greedy output is deterministic and a test
can predict it.  Run: python tests/fake_openai_server.py PORT, or with launch.sh's arguments
(MODEL --port PORT ...), as bench/e2e.py starts it when GLM5_E2E_LAUNCH names tests/fake_launch.sh.
"""
from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

from aiohttp import web

VOCAB = 997
MAX_MODEL_LEN = 4096
MODEL = "tiny.gguf"
TEMPLATE_EXTRA = 4  # tokens the "chat template" adds around the messages


def tokenize(text: str) -> list[int]:
    return [sum(map(ord, w)) * 13 % VOCAB for w in text.split()]


def generate(ids: list[int], n: int) -> list[int]:
    out, last = [], ids[-1] if ids else 1
    for _ in range(n):
        last = (last * 31 + 7) % VOCAB
        out.append(last)
    return out


def error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "param": None,
                                        "code": status}}, status=status)


def token_name(body: dict):
    """How a token is named in log-probabilities: `token_id:N` with return_tokens_as_token_ids, else its text."""
    return (lambda t: f"token_id:{t}") if body.get("return_tokens_as_token_ids") else (lambda t: f" w{t}")


def prompt_ids(body: dict) -> list[int] | web.Response:
    prompt = body.get("prompt")
    ids = prompt if isinstance(prompt, list) else tokenize(prompt or "")
    if not ids:
        return error("The prompt cannot be empty.")
    if len(ids) + max(body.get("max_tokens") or 16, 0) > MAX_MODEL_LEN:
        return error(f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your request has "
                     f"{len(ids)} input tokens.")
    return ids


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if (body.get("max_tokens") or 16) < 1:
        return error("max_tokens must be at least 1, got -1.")
    ids = prompt_ids(body)
    if isinstance(ids, web.Response):
        return ids
    n = body.get("max_tokens") or 16
    out = generate(ids, n)
    SPEC_TOKENS[0] += n
    texts = [f" w{t}" for t in out]
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t, text in zip(out, texts):
            lp = None
            if body.get("logprobs") is not None:
                name = token_name(body)
                lp = {"text_offset": [0], "token_logprobs": [-0.25], "tokens": [name(t)],
                      "top_logprobs": [{name(t): -0.25, name((t + 1) % VOCAB): -3.0}]}
            chunk = {"id": "x", "object": "text_completion", "created": 0, "model": MODEL,
                     "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {"id": "x", "object": "text_completion", "created": 0, "model": MODEL,
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
        await resp.write(f"data: {json.dumps(last)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "x", "object": "text_completion", "created": 0, "model": MODEL, "choices": [],
                     "usage": {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}}
            await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp
    choice = {"index": 0, "text": "".join(texts), "finish_reason": "length", "stop_reason": None}
    if body.get("logprobs") is not None:
        name = token_name(body)
        choice["logprobs"] = {"text_offset": list(range(n)), "token_logprobs": [-0.25] * n,
                              "tokens": [name(t) for t in out],
                              "top_logprobs": [{name(t): -0.25, name((t + 1) % VOCAB): -3.0} for t in out]}
    if body.get("return_token_ids"):
        choice["token_ids"] = out
        choice["prompt_token_ids"] = ids
    if body.get("prompt_logprobs") is not None:
        choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -1.5, "rank": 1, "decoded_token": f" w{t}"}}
                                              for t in ids[1:]]
    return web.json_response({"id": "x", "object": "text_completion", "created": 0, "model": MODEL,
                              "choices": [choice],
                              "usage": {"prompt_tokens": len(ids), "completion_tokens": n,
                                        "total_tokens": len(ids) + n}})


def chat_ids(messages) -> list[int] | web.Response:
    ids = []
    if not isinstance(messages, list):
        return error("1 validation error: messages: Input should be a valid list")
    for m in messages:
        if "role" not in m:
            return error("messages.0.role: Field required")
        if not isinstance(m.get("content") or "", str):
            return error("messages.0.content: Input should be a valid string")
        ids += tokenize(m.get("content") or "")
    return ids + [1] * TEMPLATE_EXTRA


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    ids = chat_ids(body.get("messages"))
    if isinstance(ids, web.Response):
        return ids
    n = body.get("max_tokens") or 16
    out = generate(ids, n)
    text = "".join(f" w{t}" for t in out)
    name = token_name(body)

    def logprobs(tokens):
        if not body.get("logprobs"):
            return None
        return {"content": [{"token": name(t), "logprob": -0.25, "bytes": None,
                             "top_logprobs": [{"token": name(t), "logprob": -0.25, "bytes": None},
                                              {"token": name((t + 1) % VOCAB), "logprob": -3.0, "bytes": None}]}
                            for t in tokens]}
    if body.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        half = len(out) // 2
        for part in (out[:half], out[half:]):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                     "choices": [{"index": 0,
                                  "delta": {"role": "assistant", "content": "".join(f" w{t}" for t in part)},
                                  "logprobs": logprobs(part), "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp
    return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
                              "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                           "logprobs": logprobs(out), "finish_reason": "length"}],
                              "usage": {"prompt_tokens": len(ids), "completion_tokens": n,
                                        "total_tokens": len(ids) + n}})


async def tokenize_endpoint(request: web.Request) -> web.Response:
    body = await request.json()
    ids = chat_ids(body["messages"]) if "messages" in body else tokenize(body.get("prompt", ""))
    if isinstance(ids, web.Response):
        return ids
    return web.json_response({"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids})


async def health(_request: web.Request) -> web.Response:
    return web.Response(status=200)


PROFILER_DIR: Path | None = None  # from --profiler-config's torch_profiler_dir, as vLLM 0.23 takes it
STARTUP_LINES = (  # vLLM 0.23.0's own start-up messages (format strings in its source), with made-up numbers
    "INFO 12-02 10:00:01 [gpu_model_runner.py:5188] Model loading took 2.38 GiB memory and 4.500000 seconds",
    "INFO 12-02 10:00:09 [gpu_worker.py:481] Available KV cache memory: 110.5 GiB",
    "INFO 12-02 10:00:09 [kv_cache_utils.py:1744] GPU KV cache size: 21,458,944 tokens",
    "INFO 12-02 10:00:20 [gpu_model_runner.py:6586] Graph capturing finished in 11 secs, took 0.62 GiB",
    "INFO 12-02 10:00:20 [core.py:307] init engine (profile, create kv cache, warmup model) took 18.40 s "
    "(compilation: 9.10 s)",
)


def fake_trace(steps: int = 3) -> dict:
    """A chrome trace shaped like the torch profiler's: a step annotation, a graph launch and kernels a step."""
    events, ts = [], 1000.0
    for i in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)",
                       "ts": ts, "dur": 90.0, "pid": 1, "tid": 1})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts + 1, "dur": 5.0,
                       "pid": 1, "tid": 1, "args": {"correlation": 100 + i}})
        for j, (name, dur) in enumerate((("_moe_kernel", 30.0), ("_linear_kernel", 20.0),
                                         ("_sparse_mla_fwd_kernel", 10.0), ("_paged_mqa_logits_kernel", 8.0),
                                         ("rms_norm_kernel", 2.0))):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts + 10 + 20 * j, "dur": dur,
                           "pid": 0, "tid": 7, "args": {"correlation": 100 + i}})
        ts += 100.0
    return {"traceEvents": events}


async def start_profile(_request: web.Request) -> web.Response:
    return web.Response(status=200 if PROFILER_DIR else 404)


async def stop_profile(_request: web.Request) -> web.Response:
    if PROFILER_DIR is None:
        return web.Response(status=404)
    PROFILER_DIR.mkdir(parents=True, exist_ok=True)
    with gzip.open(PROFILER_DIR / f"rank0.{time.time_ns()}.pt.trace.json.gz", "wt") as f:
        json.dump(fake_trace(), f)
    return web.Response(status=200)


SPEC_K = 0  # from --speculative-config's num_speculative_tokens
SPEC_TOKENS = [0]  # completion tokens served since start: the counters below grow with them


async def metrics(_request: web.Request) -> web.Response:
    """vLLM's spec-decode counters, made up: one draft of SPEC_K tokens a served token, 3 of 4 drafts accepted."""
    n, k = SPEC_TOKENS[0], SPEC_K
    text = "" if not k else "\n".join((
        "# TYPE vllm:spec_decode_num_drafts counter", f'vllm:spec_decode_num_drafts_total{{engine="0"}} {n}.0',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {n * k}.0',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {3 * n * k // 4}.0', ""))
    return web.Response(text=text)


def app() -> web.Application:
    a = web.Application()
    a.add_routes([web.get("/health", health), web.post("/v1/completions", completions),
                  web.post("/v1/chat/completions", chat), web.post("/tokenize", tokenize_endpoint),
                  web.post("/start_profile", start_profile), web.post("/stop_profile", stop_profile),
                  web.get("/metrics", metrics)])
    return a


if __name__ == "__main__":
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else int(argv[0])
    for i, arg in enumerate(argv[:-1]):  # the last of each flag wins, as in vLLM's parser
        if arg == "--max-model-len":
            MAX_MODEL_LEN = int(argv[i + 1])
        elif arg == "--profiler-config":
            PROFILER_DIR = Path(json.loads(argv[i + 1])["torch_profiler_dir"])
        elif arg == "--speculative-config":
            SPEC_K = int(json.loads(argv[i + 1])["num_speculative_tokens"])
    print("\n".join(STARTUP_LINES), flush=True)
    web.run_app(app(), host="127.0.0.1", port=port, print=None)

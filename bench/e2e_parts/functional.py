"""Functional checks over the openai client: greedy completions with log-probabilities, streaming vs not, chat and
its template, repeatability, bad requests; and when two answers count as the same one."""
from __future__ import annotations

import time

from .arms import GEN_TOKENS, MAX_MODEL_LEN, Arm
from .prompts import CHAT, prompts, words
from .servers import alive, http_json


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

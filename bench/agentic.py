"""Agentic serving on a GPU (#18): a scripted tiny GLM-5 GGUF served through launch.sh with GLM's own parsers
(`--reasoning-parser glm45 --tool-call-parser glm47 --enable-auto-tool-choice`), checked over the OpenAI API.

    python bench/agentic.py run --out DIR [--heads 16] [--quant Q8_0] [--ready-timeout 300]

`make-tiny --scripted` writes a model whose greedy reply after GLM-5's generation prompt is a reasoning block, a
reply and one tool call (glm5_shim/gguf/fixture/script.py). The run checks:
  * /tokenize of chat requests with tools, an assistant tool call, tool responses, and enable_thinking unset / true /
    false gives exactly the ids of what plain Jinja renders from the GGUF's template (tokenized locally);
  * chat completions with tools through the `openai` client, non-streaming and streaming: the reasoning field holds
    the script's reasoning, `content` its reply, `tool_calls` its call (name, JSON arguments), finish_reason
    tool_calls; with chat_template_kwargs {"enable_thinking": false}: no reasoning, the same reply and call.
DIR/agentic.json and DIR/agentic.md hold one PASS/FAIL line per check; the exit status is 1 when one fails, 2 when
the run cannot start (no `openai` package, server failed). `AGENTIC_RESULTS=DIR python -m pytest -q
tests/gpu/test_agentic_serve.py` checks the file.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

PARSER_ARGS = ("--reasoning-parser", "glm45", "--tool-call-parser", "glm47", "--enable-auto-tool-choice")
USER = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris today?"}]


def _round_trip(script) -> tuple[list[dict], list[dict]]:
    """(messages as an OpenAI client sends them, as the template sees them): a tool call and two tool responses."""
    call = {"id": "call_1", "type": "function", "function": {"name": script.tool, "arguments": script.arguments_json()}}
    sent = USER + [{"role": "assistant", "content": script.content, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
                   {"role": "tool", "tool_call_id": "call_1", "content": "{\"humidity\": 40}"}]
    seen = json.loads(json.dumps(sent))
    seen[2]["tool_calls"][0]["function"]["arguments"] = dict(script.arguments)  # vLLM parses the JSON string
    return sent, seen


def _reasoning(obj) -> tuple[str | None, str]:
    """vLLM 0.23 names the field `reasoning` (older servers and some clients: `reasoning_content`)."""
    extra = getattr(obj, "model_extra", None) or {}
    for name in ("reasoning", "reasoning_content"):
        value = getattr(obj, name, None) if hasattr(obj, name) else extra.get(name)
        if value is not None:
            return value, name
    return None, "-"


def run(args: argparse.Namespace) -> int:
    try:
        import openai
    except ImportError as exc:
        print(f"bench/agentic.py: the `openai` package is not importable ({exc}); vLLM's server depends on it, so "
              f"install it next to vLLM (pip install openai)", file=sys.stderr)
        return 2
    from e2e_parts import servers
    from e2e_parts.arms import Arm

    from glm5_shim.gguf.fixture import AGENTIC_SCRIPT as S
    from glm5_shim.gguf.fixture import SCRIPTED, make_tiny
    from glm5_shim.gguf.fixture.glm5_template import render_jinja
    from glm5_shim.gguf.reader import open_gguf
    from glm5_shim.gguf.tokenizer import build_hf_tokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checks: list[dict] = []

    def check(name: str, ok: bool, detail) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})
        print(f"[agentic] {'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail, ensure_ascii=False)[:300]}",
              flush=True)

    t0 = time.time()
    gguf = make_tiny(out / "agentic.gguf", quant=args.quant, heads=args.heads, write_reference=False, **SCRIPTED)[0]
    template = open_gguf(gguf).metadata["tokenizer.chat_template"]
    tokenizer = build_hf_tokenizer(gguf)
    tool = S.tool_schema()
    arm = Arm(name="agentic", quant=args.quant, kv="auto", path=args.path, port=args.port)
    result = {"gguf": str(gguf), "server_args": list(PARSER_ARGS), "checks": checks}
    try:
        servers.start(arm, {args.quant: str(gguf)}, out, tp=1, extra=PARSER_ARGS)
        servers.wait_ready(arm, args.ready_timeout)
        result["startup_s"] = arm.startup_s
        client = openai.OpenAI(base_url=arm.base + "/v1", api_key="none", timeout=120)
        model = client.models.list().data[0].id

        # 1. The server renders what Jinja renders.
        sent, seen = _round_trip(S)
        for label, kwargs in (("unset", {}), ("true", {"enable_thinking": True}),
                              ("false", {"enable_thinking": False})):
            for conv, (msgs, local) in (("user", (USER, USER)), ("tool round trip", (sent, seen))):
                body = {"model": model, "messages": msgs, "tools": [tool], "add_generation_prompt": True}
                if kwargs:
                    body["chat_template_kwargs"] = kwargs
                status, served = servers.http_json(arm.base + "/tokenize", body)
                text = render_jinja(template, local, tools=[tool], **kwargs)
                expected = tokenizer.encode(text, add_special_tokens=False)
                got = served.get("tokens")
                first = next((i for i, (a, b) in enumerate(zip(got or [], expected)) if a != b), None)
                check(f"/tokenize = Jinja ({conv}, enable_thinking {label})", status == 200 and got == expected,
                      {"status": status, "served": len(got or []), "jinja": len(expected), "first_diff": first,
                       "ends": text[-24:], **({} if status == 200 else {"error": served})})

        # 2. Chat completions with tools, non-streaming and streaming, thinking on (default) and off.
        for label, extra in (("thinking", {}), ("enable_thinking false", {"chat_template_kwargs":
                                                                           {"enable_thinking": False}})):
            want_reasoning = S.reasoning if not extra else None
            resp = client.chat.completions.create(model=model, messages=USER, tools=[tool], temperature=0,
                                                  max_tokens=64, extra_body=extra or None)
            msg = resp.choices[0].message
            reasoning, field = _reasoning(msg)
            calls = [[c.function.name, json.loads(c.function.arguments)] for c in msg.tool_calls or []]
            check(f"chat, {label}, non-streaming",
                  reasoning == want_reasoning and msg.content == S.content and calls == [[S.tool, S.arguments]]
                  and resp.choices[0].finish_reason == "tool_calls",
                  {"reasoning_field": field, "reasoning": reasoning, "content": msg.content, "tool_calls": calls,
                   "finish_reason": resp.choices[0].finish_reason})
            stream = client.chat.completions.create(model=model, messages=USER, tools=[tool], temperature=0,
                                                    max_tokens=64, stream=True, extra_body=extra or None)
            parts = {"reasoning": "", "content": "", "calls": {}, "finish": None, "chunks": 0, "field": "-"}
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                parts["chunks"] += 1
                parts["finish"] = choice.finish_reason or parts["finish"]
                piece, name = _reasoning(choice.delta)
                if piece:
                    parts["reasoning"] += piece
                    parts["field"] = name
                parts["content"] += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    entry = parts["calls"].setdefault(call.index, ["", ""])
                    entry[0] += (call.function.name or "") if call.function else ""
                    entry[1] += (call.function.arguments or "") if call.function else ""
            calls = [[n, json.loads(a) if a else None] for n, a in parts["calls"].values()]
            check(f"chat, {label}, streaming",
                  (parts["reasoning"] or None) == want_reasoning and parts["content"] == S.content
                  and calls == [[S.tool, S.arguments]] and parts["finish"] == "tool_calls",
                  {"reasoning_field": parts["field"], "reasoning": parts["reasoning"], "content": parts["content"],
                   "tool_calls": calls, "finish_reason": parts["finish"], "chunks": parts["chunks"]})
    except Exception as exc:  # a failed start or request is a result too: record it
        check("run", False, f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        servers.stop(arm)
    result["wall_s"] = round(time.time() - t0, 1)
    result["backends"] = servers.backends_from_log(arm.log) if arm.log else "-"
    (out / "agentic.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = ["# Agentic serving (#18): scripted tiny GLM-5 GGUF, `vllm serve` through launch.sh with "
             f"`{' '.join(PARSER_ARGS)}`", "", f"- model: `{gguf.name}` ({args.quant}, {args.heads} heads, "
             f"path {args.path}); server start {result.get('startup_s', '-')} s; run {result['wall_s']} s",
             f"- backends: {result['backends']}", ""]
    lines += [f"- {'PASS' if c['ok'] else 'FAIL'} {c['name']}: `{json.dumps(c['detail'], ensure_ascii=False)[:400]}`"
              for c in checks]
    (out / "agentic.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    failed = [c["name"] for c in checks if not c["ok"]]
    print(f"[agentic] {len(checks) - len(failed)}/{len(checks)} checks passed; {out / 'agentic.md'}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/agentic.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="make the scripted GGUF, serve it with GLM's parsers, check over the OpenAI API")
    r.add_argument("--out", required=True)
    r.add_argument("--heads", type=int, default=16)
    r.add_argument("--quant", default="Q8_0", choices=("Q8_0", "Q4_K"))
    r.add_argument("--path", default="shim", choices=("shim", "native"),
                   help="shim: the shim's Triton attention and indexer forced (SM120's path); native: vLLM's choice")
    r.add_argument("--port", type=int, default=8471)
    r.add_argument("--ready-timeout", type=float, default=300)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

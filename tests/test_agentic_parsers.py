"""#18: vLLM's own glm45 reasoning parser and glm47 tool parser (the parser object `vllm serve --reasoning-parser
glm45 --tool-call-parser glm47 --enable-auto-tool-choice` builds, driven as its chat server drives it: `parse` for a
whole reply, `parse_delta` per token, text from the incremental decoder vLLM's detokenizer uses) on the tokenizer the
shim rebuilds from a GGUF, with the scripted tiny model's replies."""
from __future__ import annotations

import pytest

from glm5_shim.gguf.fixture import AGENTIC_SCRIPT, make_tiny
from tests.helpers import last_json, run_python

CHILD = r'''
import json, sys
from tokenizers.decoders import DecodeStream
from vllm.tokenizers import get_tokenizer
from vllm.parser.parser_manager import ParserManager
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

path, script, tool = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tok = get_tokenizer(path)
cls = ParserManager.get_parser(tool_parser_name="glm47", reasoning_parser_name="glm45", enable_auto_tools=True)
script_ids = tok.encode(script, add_special_tokens=False)
end_think = tok.convert_tokens_to_ids("</think>")
out = {"tokenizer": type(tok).__name__, "ids": {t: tok.convert_tokens_to_ids(t) for t in
       ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|observation|>")}}

def run(case, thinking, tools, stream):
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    request = ChatCompletionRequest(model="m", messages=messages, tools=[tool] if tools else None,
                                    chat_template_kwargs=kwargs, stream=stream)
    parser = cls(tok, request.tools, chat_template_kwargs=dict(kwargs))
    request = parser.adjust_request(request)
    reply = script_ids if thinking is not False else script_ids[script_ids.index(end_think) + 1:]
    prompt = tok.apply_chat_template(messages, tools=request.tools and [tool], tokenize=True,
                                     add_generation_prompt=True, **kwargs)
    prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
    result = {"skip_special_tokens": request.skip_special_tokens}
    if not stream:
        text = tok.decode(reply, skip_special_tokens=request.skip_special_tokens)
        reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
        result.update(reasoning=reasoning, content=content,
                      calls=[[c.name, c.arguments] for c in calls or []])
    else:
        decoder = DecodeStream(skip_special_tokens=request.skip_special_tokens)
        reasoning, content, calls = "", "", {}
        for n, token in enumerate(reply):
            delta_text = decoder.step(tok.backend_tokenizer, token) or ""
            delta = parser.parse_delta(delta_text, [token], request, prompt_token_ids=prompt,
                                       finished=n == len(reply) - 1)
            if delta is None:
                continue
            reasoning += delta.reasoning or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                if call.function and call.function.name:
                    entry[0] += call.function.name
                if call.function and call.function.arguments:
                    entry[1] += call.function.arguments
        result.update(reasoning=reasoning or None, content=content or None, calls=list(calls.values()))
    out[case] = result

for thinking in (None, True, False):
    for stream in (False, True):
        run(f"think={thinking} stream={stream}", thinking, True, stream)
run("no-tools", None, False, False)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import json

    path = make_tiny(tmp_path_factory.mktemp("agentic") / "scripted.gguf", layers=2, index_heads=4,
                     write_reference=False)[0]
    argv = [str(path), AGENTIC_SCRIPT.text(), json.dumps(AGENTIC_SCRIPT.tool_schema())]
    proc = run_python("import sys\nsys.argv[1:] = " + repr(argv) + "\n" + CHILD,
                      timeout=600)
    return last_json(proc)


def test_parsers_find_glm5s_tokens_in_the_rebuilt_tokenizer(results):
    ids = results["ids"]
    assert len(set(ids.values())) == 5 and all(i >= 1536 for i in ids.values())
    assert results["tokenizer"] != "MistralTokenizer"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("thinking", [None, True])
def test_reasoning_and_tool_call_are_split(results, thinking, stream):
    # enable_thinking unset: glm45 assumes thinking, as GLM-5's template does.
    result = results[f"think={thinking} stream={stream}"]
    assert result["skip_special_tokens"] is False  # the glm47 parser asks for it when tools are given
    assert result["reasoning"] == AGENTIC_SCRIPT.reasoning
    assert result["content"] == AGENTIC_SCRIPT.content
    assert [[name, json_loads(args)] for name, args in result["calls"]] == [[AGENTIC_SCRIPT.tool,
                                                                             AGENTIC_SCRIPT.arguments]]


@pytest.mark.parametrize("stream", [False, True])
def test_enable_thinking_false_gives_no_reasoning(results, stream):
    result = results[f"think=False stream={stream}"]
    assert result["reasoning"] is None
    assert result["content"] == AGENTIC_SCRIPT.content
    assert [[name, json_loads(args)] for name, args in result["calls"]] == [[AGENTIC_SCRIPT.tool,
                                                                             AGENTIC_SCRIPT.arguments]]


def test_without_tools_reasoning_still_splits_with_special_tokens_skipped(results):
    # No tools: vLLM decodes with skip_special_tokens=True; </think> is not special in GLM-5's tokenizer, so it
    # stays in the text and the reasoning parser still finds it (the tool call is left in the content).
    result = results["no-tools"]
    assert result["skip_special_tokens"] is True
    assert result["reasoning"] == AGENTIC_SCRIPT.reasoning
    assert result["content"].startswith(AGENTIC_SCRIPT.content + "<tool_call>") and result["calls"] == []


def json_loads(text):
    import json
    return json.loads(text)

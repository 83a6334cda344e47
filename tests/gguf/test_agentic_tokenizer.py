"""#18: GLM-5's added tokens, special flags and chat template through the tokenizer the shim rebuilds from a GGUF,
and the scripted tiny model agentic serving tests use."""

from __future__ import annotations

import numpy as np
import pytest

from glm5_shim.gguf.fixture import AGENTIC_SCRIPT, GLM_ADDED_TOKENS, GLM_HF_SPECIAL_TOKENS, SCRIPTED, \
    ReferenceModel, script_successors, tiny_tokenizer
from glm5_shim.gguf.fixture.glm5_template import GLM5_CHAT_TEMPLATE, render_jinja
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.tokenizer import build_hf_tokenizer, make_pre_tokenizer, save_tokenizer_dir

ADDED = [token for token, _ in GLM_ADDED_TOKENS]
# Every added token glued to text on both sides, alone, doubled, and inside GLM-5's own formats.
TEXTS = [f"x{token}y" for token in ADDED] + [
    "".join(ADDED), "  ".join(ADDED),
    "Need weather</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "</tool_call>",
    "<|observation|><tool_response>sunny</tool_response><|assistant|><think>ok</think>done<|user|>",
    "<|code_prefix|>def f():<|code_suffix|>    return 1<|code_middle|>/nothink <|begin_of_box|>[1,2]<|end_of_box|>",
    "<think<thin></think >< tool_call>",  # near misses stay ordinary text
]


def _tokenizers_reference(path):
    """A `tokenizers` tokenizer built from the GGUF's vocabulary and merges and GLM-5's added-token table (HF special
    flags), independently of the shim's rebuild."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    meta = open_gguf(path).metadata
    tokens = meta["tokenizer.ggml.tokens"]
    added = set(ADDED)
    vocab = {t: i for i, t in enumerate(tokens) if t not in added and not t.startswith("[PAD")}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = make_pre_tokenizer("glm4")
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in GLM_ADDED_TOKENS])
    assert [tokenizer.token_to_id(t) for t in ADDED] == [tokens.index(t) for t in ADDED]
    return tokenizer


@pytest.fixture(scope="module")
def rebuilt(q8):
    return build_hf_tokenizer(q8.path)


@pytest.fixture(scope="module")
def reference(q8):
    return _tokenizers_reference(q8.path)


@pytest.mark.parametrize("text", TEXTS)
def test_rebuilt_tokenizer_matches_a_tokenizers_build_of_the_same_table(rebuilt, reference, text):
    ids = reference.encode(text).ids
    assert rebuilt.encode(text, add_special_tokens=False) == ids
    for skip in (False, True):
        assert rebuilt.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    assert rebuilt.decode(ids) == text


def test_every_added_token_is_atomic_both_ways(q8, rebuilt):
    tokens = open_gguf(q8.path).metadata["tokenizer.ggml.tokens"]
    for token in ADDED:
        token_id = tokens.index(token)
        assert rebuilt.encode(f"a{token}b", add_special_tokens=False)[1:-1] == [token_id], token
        assert rebuilt.convert_ids_to_tokens(token_id) == token
        assert rebuilt.decode([token_id], skip_special_tokens=False) == token


def test_skip_special_tokens_keeps_what_glm5s_hf_tokenizer_keeps(q8, rebuilt, reference):
    # GLM-5's HF special set is the 18 role / mask / media tokens; <think>, <tool_call>, <arg_key> ... and the
    # <|code_*|>, <|*_box|>, <|image|>, <|video|> tokens (CONTROL in the GGUF: they look special) reach the text.
    tokens = open_gguf(q8.path).metadata["tokenizer.ggml.tokens"]
    assert set(rebuilt.all_special_ids) == {tokens.index(t) for t in GLM_HF_SPECIAL_TOKENS}
    for token, special in GLM_ADDED_TOKENS:
        ids = rebuilt.encode(f"a{token}b", add_special_tokens=False)
        assert rebuilt.decode(ids, skip_special_tokens=True) == ("ab" if special else f"a{token}b"), token
    # The same through the directory vLLM loads (tokenizer.json + tokenizer_config.json), and token by token with
    # the incremental decoder vLLM's detokenizer uses.
    from tokenizers.decoders import DecodeStream
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(save_tokenizer_dir(q8.path, q8.path.parent / "agentic-tok")))
    ids = reference.encode(TEXTS[-3]).ids + reference.encode(TEXTS[-4]).ids
    for skip in (False, True):
        expected = reference.decode(ids, skip_special_tokens=skip)
        assert loaded.decode(ids, skip_special_tokens=skip) == expected
        stream = DecodeStream(skip_special_tokens=skip)
        assert "".join(stream.step(loaded.backend_tokenizer, i) or "" for i in ids) == expected


CONVERSATIONS = {
    "tools": [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "What is the weather in Paris?"}],
    "tool-round-trip": [
        {"role": "user", "content": "What is the weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need weather", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain, 14 C"}],
    "history": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>greet</think>Hello!"},
        {"role": "user", "content": "Numbers: {\"a\": [1, 2]} ✓ 漢字"}],
}


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_template_renders_what_jinja_renders(q8, rebuilt, reference, name, thinking):
    meta = open_gguf(q8.path).metadata
    assert meta["tokenizer.chat_template"] == GLM5_CHAT_TEMPLATE
    messages = CONVERSATIONS[name]
    tools = [AGENTIC_SCRIPT.tool_schema()] if name != "history" else None
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    expected = render_jinja(GLM5_CHAT_TEMPLATE, messages, tools=tools, **kwargs)
    text = rebuilt.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs)
    assert text == expected
    ids = rebuilt.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True, **kwargs)
    ids = list(ids if isinstance(ids, list) else ids["input_ids"])
    assert ids == reference.encode(expected).ids
    assert text.endswith("<|assistant|></think>" if thinking is False else "<|assistant|><think>")
    if tools:
        assert '"name": "get_weather"' in text and text.startswith("[gMASK]<sop><|system|>\n# Tools")
    if name == "tool-round-trip":
        assert ("<|assistant|><think>Need weather</think>Checking.<tool_call>get_weather<arg_key>city</arg_key>"
                "<arg_value>Paris</arg_value></tool_call><tool_call>get_weather<arg_key>city</arg_key><arg_value>"
                "Rome</arg_value></tool_call><|observation|><tool_response>sunny, 21 C</tool_response>"
                "<tool_response>rain, 14 C</tool_response>") in text


def test_script_with_a_repeated_token_is_refused():
    from tokenizers import Tokenizer

    tokenizer = tiny_tokenizer()
    ids = Tokenizer.from_str(tokenizer.tokenizer_json).encode(AGENTIC_SCRIPT.text()).ids
    assert len(set(ids)) == len(ids)
    assert len(script_successors(tokenizer.tokenizer_json, AGENTIC_SCRIPT.text())) == len(ids) + 1
    with pytest.raises(ValueError, match=r"script 'Need weather\. Checking\.': token '\.' occurs at positions"):
        script_successors(tokenizer.tokenizer_json, "Need weather. Checking.")


def test_scripted_model_says_the_script_after_both_generation_prompts(tiny):
    """Teacher-forced float32 reference over prompt + script: at every step from the last prompt token the greedy
    choice is the script's next token, by a wide margin (a bf16 engine cannot flip it)."""
    model = tiny("scripted", heads=4, **SCRIPTED)
    tokenizer = build_hf_tokenizer(model.path)
    ref = ReferenceModel.from_reference_dir(model.reference)
    script_ids = tokenizer.encode(AGENTIC_SCRIPT.text(), add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|observation|>")
    think_end = script_ids.index(tokenizer.convert_tokens_to_ids("</think>"))
    for thinking, reply in ((True, script_ids), (False, script_ids[think_end + 1:])):
        prompt = tokenizer.apply_chat_template(CONVERSATIONS["tools"], tools=[AGENTIC_SCRIPT.tool_schema()],
                                               tokenize=True, add_generation_prompt=True, enable_thinking=thinking)
        prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
        logits, _ = ref.trunk(prompt + reply)
        steps = logits[len(prompt) - 1:]
        assert list(np.argmax(steps, axis=-1)) == reply + [end]
        top2 = np.sort(steps, axis=-1)[:, -2:]
        assert float(np.min(top2[:, 1] - top2[:, 0])) > 5.0
    assert tokenizer.decode(script_ids) == AGENTIC_SCRIPT.text()

"""The tokenizer rebuilt from tokenizer.ggml.* must behave exactly like the one the fixture trained."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.fixture import GLM_HF_SPECIAL_TOKENS, GLM_SPECIAL_TOKENS
from glm5_shim.gguf.reader import open_gguf
from glm5_shim.gguf.tokenizer import (GLM4_PRETOKENIZER_REGEX, build_hf_tokenizer, build_tokenizers_tokenizer,
                                      make_pre_tokenizer, save_tokenizer_dir)

TEXTS = [
    "Hello world",
    "The harbour town woke slowly.",
    "It's what you've got; they'd say we'll see, I'm sure THEY'RE right.",
    "Numbers: 1 12 123 1234 12345 3.14159 2024-01-01 0x1F 1e-05 100000",
    "tabs\tand  double  spaces,   triple   and\n\nnewlines\r\nwindows\r\n   \n  trailing   ",
    "    indented = 4\n        deeper()\n",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n",
    "int main(void) { printf(\"%d\\n\", a[i]++); return 0; }",
    "Unicode: café naïve Zürich São Paulo привет мир 你好，世界。 こんにちは αβγ",
    "Emoji 😀🎉🚀 and symbols → ★ ✓ ∑ π ≈ 3.14 — «quotes» “curly”",
    "Combining: e\u0301 a\u0308 and zero\u200bwidth",
    "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi there!<|assistant|>\n<think>plan</think>Hello.<|endoftext|>",
    "text<|user|>glued<|observation|>{\"tool\": 1}<eop>[MASK][sMASK]",
    "",
    " ",
    "a",
    "\n",
    "x" * 300,
    "ZZZZZ qqqq jjjj unseen-words xylophone",
]


@pytest.fixture(scope="module")
def reference(q8):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(q8.reference / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_tokenizer(q8):
    return build_hf_tokenizer(q8.path)


@pytest.mark.parametrize("text", TEXTS)
def test_same_ids_as_reference(reference, hf_tokenizer, text):
    expected = reference.encode(text).ids
    assert hf_tokenizer.encode(text, add_special_tokens=False) == expected
    assert hf_tokenizer.encode(text) == expected  # GLM adds no BOS/EOS automatically
    assert hf_tokenizer.decode(expected) == text
    assert reference.decode(expected, skip_special_tokens=False) == text


def test_backend_tokenizer_matches_reference(q8, reference):
    backend = build_tokenizers_tokenizer(q8.path)
    for text in TEXTS:
        assert backend.encode(text).ids == reference.encode(text).ids
    # Every id of the reference vocabulary means the same token.
    for token, token_id in reference.get_vocab(with_added_tokens=True).items():
        assert backend.token_to_id(token) == token_id
    # Padding entries exist in the GGUF list but are never produced.
    tokens = open_gguf(q8.path).metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == backend.get_vocab_size() > reference.get_vocab_size()
    assert tokens[-1].startswith("[PAD")


def test_special_tokens(q8, reference, hf_tokenizer):
    ids = {t: reference.token_to_id(t) for t in GLM_SPECIAL_TOKENS}
    meta = open_gguf(q8.path).metadata
    assert hf_tokenizer.eos_token == "<|endoftext|>" and hf_tokenizer.eos_token_id == ids["<|endoftext|>"]
    assert hf_tokenizer.pad_token_id == meta["tokenizer.ggml.padding_token_id"] == ids["<|endoftext|>"]
    assert hf_tokenizer.bos_token == "[gMASK]" and hf_tokenizer.bos_token_id == ids["[gMASK]"]
    assert hf_tokenizer.unk_token_id == ids["<|endoftext|>"]
    # GLM's HF special set: the 18 role/mask/media tokens; <think>, <tool_call>, <|code_prefix|> ... are not special.
    assert set(hf_tokenizer.all_special_ids) == {ids[t] for t in GLM_HF_SPECIAL_TOKENS}
    text = "<|user|>hi<|assistant|>"
    encoded = hf_tokenizer.encode(text)
    assert encoded[0] == ids["<|user|>"] and encoded[-1] == ids["<|assistant|>"]
    assert hf_tokenizer.decode(encoded, skip_special_tokens=True) == "hi"


def test_chat_template(hf_tokenizer, reference):
    # GLM-5's own template (fixture/glm5_template.py): no newline after a role token, the generation prompt opens
    # the reasoning block, an earlier assistant turn gets an empty one.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("[gMASK]<sop><|system|>Be brief.<|user|>What is 2+2?<|assistant|></think>4"
                    "<|user|>And 3+3?<|assistant|><think>")
    ids = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding here
        ids = ids["input_ids"]
    assert ids == reference.encode(text).ids
    assert ids[:2] == [reference.token_to_id("[gMASK]"), reference.token_to_id("<sop>")]
    assert ids[-2:] == [reference.token_to_id("<|assistant|>"), reference.token_to_id("<think>")]
    no_think = hf_tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True,
                                                enable_thinking=False)
    assert no_think.endswith("<|assistant|></think>")


def test_saved_directory_loads_with_auto_tokenizer(q8, reference, hf_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    out = save_tokenizer_dir(q8.path, tmp_path / "tok")
    assert {p.name for p in out.iterdir()} >= {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == open_gguf(q8.path).metadata["tokenizer.chat_template"]
    loaded = AutoTokenizer.from_pretrained(str(out))
    for text in TEXTS:
        assert loaded.encode(text) == reference.encode(text).ids
    assert loaded.eos_token_id == hf_tokenizer.eos_token_id and loaded.bos_token_id == hf_tokenizer.bos_token_id
    assert set(loaded.all_special_ids) == set(hf_tokenizer.all_special_ids)
    messages = [{"role": "user", "content": "Hello"}]
    assert (loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_glm4_pre_tokenizer_splits():
    pre = make_pre_tokenizer("glm4")
    pieces = [p for p, _ in pre.pre_tokenize_str("it's 12345 ab\n\ncd")]
    # byte-level alphabet: Ġ = space, Ċ = newline
    assert pieces == ["it", "'s", "Ġ", "123", "45", "Ġab", "ĊĊ", "cd"]
    assert r"\p{N}{1,3}" in GLM4_PRETOKENIZER_REGEX


def test_unknown_pre_tokenizer_falls_back_to_gpt2(small):
    odd = small("pre-unknown", metadata_overrides={"tokenizer.ggml.pre": "something-new"})
    with pytest.warns(UserWarning, match="something-new"):
        tokenizer = build_tokenizers_tokenizer(odd.path)
    text = "Hello world 12345"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_non_bpe_vocabulary_is_rejected(small):
    bad = small("spm", metadata_overrides={"tokenizer.ggml.model": "llama"})
    with pytest.raises(GGUFError) as exc_info:
        build_hf_tokenizer(bad.path)
    message = str(exc_info.value)
    assert str(bad.path) in message and "tokenizer.ggml.model" in message and "'llama'" in message


def test_gguf_package_does_not_import_vllm_or_heavy_libraries(q8, tmp_path):
    code = (
        "import sys\n"
        "import glm5_shim.gguf.reader, glm5_shim.gguf.config, glm5_shim.gguf.tensor_map, glm5_shim.gguf.kv_b\n"
        "import glm5_shim.gguf.dequant, glm5_shim.gguf.validate, glm5_shim.report\n"
        "import glm5_shim.gguf.tokenizer, glm5_shim.gguf.fixture\n"
        "heavy = [m for m in ('vllm', 'torch', 'transformers', 'tokenizers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from glm5_shim.gguf.tokenizer import save_tokenizer_dir\n"
        f"save_tokenizer_dir({str(q8.path)!r}, {str(tmp_path / 'tok')!r})\n"
        "assert 'vllm' not in sys.modules\n"
    )
    import glm5_shim
    from pathlib import Path
    root = Path(glm5_shim.__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)

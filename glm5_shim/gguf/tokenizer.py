"""Build a Hugging Face fast tokenizer from a GGUF's `tokenizer.ggml.*` metadata (byte-level BPE only).

No network and no vLLM: the vocabulary, merges, token types and special ids come from the GGUF, the
pre-tokenizer regex from `tokenizer.ggml.pre`. `tokenizers` and `transformers` are imported lazily.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .errors import GGUFError
from .reader import GGUFModel, open_gguf

# llama.cpp token types (gguf.TokenType).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# GLM-4/4.5/5 (`glm4`, also `chatglm-bpe`): the Split regex of their tokenizer.json, which llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_CHATGLM4 reproduces. Digits are grouped by up to three.
GLM4_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen-2 style: like GLM-4 but single digits.
QWEN2_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRETOKENIZER_REGEXES = {
    "glm4": GLM4_PRETOKENIZER_REGEX,
    "chatglm-bpe": GLM4_PRETOKENIZER_REGEX,
    "qwen2": QWEN2_PRETOKENIZER_REGEX,
}
# Anything else ("default", "gpt-2", unknown names) falls back to GPT-2's own byte-level regex.
GPT2_PRE_NAMES = ("default", "gpt-2", "gpt2")

SPECIAL_ID_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}
EXTRA_ID_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")

# llama.cpp's converter types an added token CONTROL when the HF tokenizer marks it special *or* it looks special
# (`<|...|>`), USER_DEFINED otherwise. GLM's HF tokenizer (GLM-4.5 .. GLM-5) marks these `<|...|>` tokens not
# special, so its decode(skip_special_tokens=True) keeps them in the text: with a GLM vocabulary (tokenizer.ggml.pre
# glm4 / chatglm-bpe) the rebuilt tokenizer keeps them non-special too, as the original does.
GLM_PRE_NAMES = ("glm4", "chatglm-bpe")
GLM_HF_NOT_SPECIAL_CONTROL = frozenset({"<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<|begin_of_box|>",
                                        "<|end_of_box|>", "<|image|>", "<|video|>"})


def special_flags(model: GGUFModel) -> dict[int, bool]:
    """Token id → whether the HF tokenizer treats it as special, for every added (CONTROL or USER_DEFINED) token.

    Every added token is atomic (never split, in encode and decode alike); special ones are also skipped by
    decode(skip_special_tokens=True). CONTROL tokens are special, USER_DEFINED ones are not, except the `<|...|>`
    tokens GLM's HF tokenizer keeps non-special (GLM_HF_NOT_SPECIAL_CONTROL)."""
    tokens = model.metadata["tokenizer.ggml.tokens"]
    types = model.metadata.get("tokenizer.ggml.token_type") or []
    glm = model.metadata.get("tokenizer.ggml.pre") in GLM_PRE_NAMES
    return {i: kind == TOKEN_CONTROL and not (glm and tok in GLM_HF_NOT_SPECIAL_CONTROL)
            for i, (tok, kind) in enumerate(zip(tokens, types)) if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}


def make_pre_tokenizer(pre: str | None):
    """The `tokenizers` pre-tokenizer for a `tokenizer.ggml.pre` name (byte-level, no prefix space)."""
    from tokenizers import Regex, pre_tokenizers

    regex = PRETOKENIZER_REGEXES.get(pre or "default")
    if regex is None:
        if pre not in GPT2_PRE_NAMES and pre is not None:
            warnings.warn(f"tokenizer.ggml.pre {pre!r} is not known; using GPT-2's byte-level pre-tokenizer",
                          stacklevel=2)
        return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])


def _require_list(model: GGUFModel, key: str, item_type: type) -> list:
    value = model.metadata.get(key)
    if not isinstance(value, list) or not value:
        raise GGUFError(f"{model.path}: metadata key {key}: expected a non-empty array, found "
                        f"{type(value).__name__ if value is not None else 'nothing'}")
    if not isinstance(value[0], item_type):
        raise GGUFError(f"{model.path}: metadata key {key}: expected {item_type.__name__} items, "
                        f"found {type(value[0]).__name__}")
    return value


def _split_merge(merge: str) -> tuple[str, str]:
    # Search from index 1 so a merge whose left part starts with a space still splits correctly.
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ValueError(merge)
    return merge[:cut], merge[cut + 1:]


def _open(source: str | Path | GGUFModel) -> GGUFModel:
    return source if isinstance(source, GGUFModel) else open_gguf(source, expected_architecture=None)


def build_tokenizers_tokenizer(source: str | Path | GGUFModel):
    """A `tokenizers.Tokenizer` equivalent to the GGUF's vocabulary (ids preserved)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    model = _open(source)
    kind = model.metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{model.path}: metadata key tokenizer.ggml.model: expected 'gpt2' (byte-level BPE), "
                        f"found {kind!r}")
    tokens = _require_list(model, "tokenizer.ggml.tokens", str)
    merges_raw = _require_list(model, "tokenizer.ggml.merges", str)
    types = model.metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise GGUFError(f"{model.path}: metadata key tokenizer.ggml.token_type has {len(types)} entries, "
                        f"expected {len(tokens)} (one per tokenizer.ggml.tokens entry)")

    vocab: dict[str, int] = {}
    duplicates = 0
    for token_id, token in enumerate(tokens):
        if token in vocab:
            duplicates += 1
            continue
        vocab[token] = token_id
    if duplicates:
        warnings.warn(f"{model.path}: tokenizer.ggml.tokens has {duplicates} duplicate strings; "
                      f"the later ids are unreachable", stacklevel=2)
    merges = []
    for i, merge in enumerate(merges_raw):
        try:
            merges.append(_split_merge(merge))
        except ValueError:
            raise GGUFError(f"{model.path}: metadata key tokenizer.ggml.merges: entry {i} {merge!r} is not "
                            f"'<left> <right>'") from None

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                                     fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = make_pre_tokenizer(model.metadata.get("tokenizer.ggml.pre"))
    tokenizer.decoder = decoders.ByteLevel()

    # Added tokens are never split; special ones are also skipped on decode (special_flags).
    added = []
    for token_id, special in special_flags(model).items():
        token = tokens[token_id]
        if vocab.get(token) == token_id:
            added.append(AddedToken(token, special=special, normalized=False,
                                    lstrip=False, rstrip=False, single_word=False))
    if added:
        tokenizer.add_tokens(added)
    return tokenizer


def _special_tokens(model: GGUFModel) -> tuple[dict[str, str], list[str]]:
    tokens = model.metadata["tokenizer.ggml.tokens"]
    named: dict[str, str] = {}

    def token_for(key: str) -> str | None:
        token_id = model.metadata.get(key)
        if token_id is None:
            return None
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
            raise GGUFError(f"{model.path}: metadata key {key}: expected a token id in 0..{len(tokens) - 1}, "
                            f"found {token_id!r}")
        return tokens[token_id]

    for name, key in SPECIAL_ID_KEYS.items():
        token = token_for(key)
        if token is not None:
            named[name] = token
    extra = [tokens[i] for i, special in special_flags(model).items() if special and tokens[i] not in named.values()]
    for key in EXTRA_ID_KEYS:
        token = token_for(key)
        if token is not None and token not in extra and token not in named.values():
            extra.append(token)
    return named, extra


def build_hf_tokenizer(source: str | Path | GGUFModel):
    """A `transformers.PreTrainedTokenizerFast` with special tokens and the GGUF's chat template."""
    from transformers import PreTrainedTokenizerFast

    model = _open(source)
    backend = build_tokenizers_tokenizer(model)
    named, extra = _special_tokens(model)
    kwargs: dict[str, Any] = dict(named)
    template = model.metadata.get("tokenizer.chat_template")
    if template is not None:
        kwargs["chat_template"] = template
    max_len = model.metadata.get(f"{model.architecture}.context_length")
    if isinstance(max_len, int):
        kwargs["model_max_length"] = max_len
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **kwargs)
    if extra:
        # transformers 5 renamed the keep-existing flag (replace_additional_special_tokens → replace_extra_...)
        import inspect

        params = inspect.signature(tokenizer.add_special_tokens).parameters
        keep = next((p for p in ("replace_additional_special_tokens", "replace_extra_special_tokens") if p in params),
                    None)
        tokenizer.add_special_tokens({"additional_special_tokens": extra}, **({keep: False} if keep else {}))
    return tokenizer


def tokenizer_config_dict(source: str | Path | GGUFModel) -> dict[str, Any]:
    """tokenizer_config.json contents understood by transformers 4.57 and 5.x."""
    model = _open(source)
    named, extra = _special_tokens(model)
    tokens = model.metadata["tokenizer.ggml.tokens"]
    added_tokens_decoder = {
        str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": special}
        for i, special in special_flags(model).items()
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder,
        **named,
    }
    if extra:
        config["additional_special_tokens"] = extra
    max_len = model.metadata.get(f"{model.architecture}.context_length")
    if isinstance(max_len, int):
        config["model_max_length"] = max_len
    template = model.metadata.get("tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return config


def save_tokenizer_dir(gguf_path: str | Path | GGUFModel, out_dir: str | Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json (and chat_template.jinja).

    `AutoTokenizer.from_pretrained(out_dir)` then works without the GGUF, vLLM or network.
    """
    model = _open(gguf_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizers_tokenizer(model).save(str(out / "tokenizer.json"))
    config = tokenizer_config_dict(model)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    named, extra = _special_tokens(model)
    special_map: dict[str, Any] = dict(named)
    if extra:
        special_map["additional_special_tokens"] = extra
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
    if "chat_template" in config:
        # transformers >= 4.43 also reads this file, and 5.x prefers it; same text as in the config.
        (out / "chat_template.jinja").write_text(config["chat_template"], encoding="utf-8")
    return out

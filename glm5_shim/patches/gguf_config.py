"""GLM-5's config and tokenizer come from the GGUF itself.

Targets:
* ``vllm.transformers_utils.config.get_config`` — for a local glm-dsa GGUF it asks transformers to parse the file,
  which raises "GGUF model with architecture glm-dsa is not supported yet".  The replacement builds the config from
  the GGUF metadata (validated first: a bad file stops here with one line), then applies vLLM's own overrides and
  rope normalisation.  ``--hf-config-path`` still wins: vLLM then passes that path, not the GGUF.
  It also registers ``glm_moe_dsa`` with vLLM's config registry and AutoConfig when transformers lacks it.
* ``vllm.transformers_utils.config.try_get_generation_config`` — vLLM returns None for every GGUF, so only the
  tokenizer's eos (<|endoftext|>) would stop generation and a chat reply would run past its turn.  For a glm-dsa
  GGUF the replacement returns a GenerationConfig with GLM-5's end-of-turn ids (eos, eot, eom) from the metadata.
* ``vllm.tokenizers.registry.cached_resolve_tokenizer_args`` — a glm-dsa GGUF tokenizer path is swapped for a
  directory holding the tokenizer rebuilt from ``tokenizer.ggml.*`` (tokenizer.json, tokenizer_config.json with the
  GGUF's chat template), so vLLM loads it like any Hugging Face tokenizer.  ``--tokenizer`` still wins.
"""
from __future__ import annotations

from glm5_shim.registry import Patch, require, require_attr, require_params, require_names

_GET_CONFIG_PARAMS = ("model", "trust_remote_code", "revision", "code_revision", "config_format",
                      "hf_overrides_kw", "hf_overrides_fn")


# -- config ----------------------------------------------------------------------------------------------------
def _check_config(tc) -> None:
    func = require_attr(tc, "get_config", "vllm.transformers_utils.config")
    require_params(func, _GET_CONFIG_PARAMS, "vllm.transformers_utils.config.get_config")
    registry = require_attr(tc, "_CONFIG_REGISTRY", "vllm.transformers_utils.config")
    require(hasattr(registry, "__contains__") and hasattr(registry, "__setitem__"),
            "_CONFIG_REGISTRY is no longer a mutable mapping")
    require(callable(getattr(tc, "patch_rope_parameters", None)),
            "vllm.transformers_utils.config.patch_rope_parameters is missing")


def _apply_config(tc, patch: Patch) -> None:
    import inspect

    from glm5_shim.loading.hf_config import config_from_gguf, is_glm_dsa_gguf, refuse_unreadable_gguf, \
        register_config_class

    register_config_class(tc._CONFIG_REGISTRY)
    original = tc.get_config
    signature = inspect.signature(original)

    def get_config(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        model = bound.arguments["model"]
        if not is_glm_dsa_gguf(model):
            refuse_unreadable_gguf(model)
            return original(*args, **kwargs)
        config = config_from_gguf(model)
        overrides_kw = bound.arguments.get("hf_overrides_kw")
        overrides_fn = bound.arguments.get("hf_overrides_fn")
        if overrides_kw:
            config.update(overrides_kw)
        if overrides_fn:
            config = overrides_fn(config)
        tc.patch_rope_parameters(config)
        return config

    patch.replace(tc, "get_config", get_config)
    # Modules that imported get_config by name before this hook ran keep the old binding; rebind them.
    import sys

    for name in ("vllm.config.model", "vllm.tokenizers.registry"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_config", None) is original:
            patch.replace(module, "get_config", get_config)


# -- generation config -------------------------------------------------------------------------------------------
def _check_generation(tc) -> None:
    func = require_attr(tc, "try_get_generation_config", "vllm.transformers_utils.config")
    require_params(func, ("model", "trust_remote_code"), "vllm.transformers_utils.config.try_get_generation_config")


def _apply_generation(tc, patch: Patch) -> None:
    from glm5_shim.loading.hf_config import generation_config_from_gguf, is_glm_dsa_gguf

    original = tc.try_get_generation_config

    def try_get_generation_config(model, *args, **kwargs):
        if is_glm_dsa_gguf(model):
            return generation_config_from_gguf(model)
        return original(model, *args, **kwargs)

    patch.replace(tc, "try_get_generation_config", try_get_generation_config)


# -- tokenizer -------------------------------------------------------------------------------------------------
def _check_tokenizer(registry_module) -> None:
    resolve = require_attr(registry_module, "resolve_tokenizer_args", "vllm.tokenizers.registry")
    require_params(resolve, ("tokenizer_name",), "vllm.tokenizers.registry.resolve_tokenizer_args")
    cached = require_attr(registry_module, "cached_resolve_tokenizer_args", "vllm.tokenizers.registry")
    require(hasattr(cached, "cache_clear"), "cached_resolve_tokenizer_args is no longer an lru_cache")
    get_tokenizer = require_attr(registry_module, "get_tokenizer", "vllm.tokenizers.registry")
    require_names(get_tokenizer, "get_tokenizer", "cached_resolve_tokenizer_args",
                  why="it resolves its arguments there")


def _apply_tokenizer(registry_module, patch: Patch) -> None:
    from functools import lru_cache

    from glm5_shim.loading.hf_config import is_glm_dsa_gguf
    from glm5_shim.loading.tokenizer_dir import tokenizer_dir_for

    original = registry_module.resolve_tokenizer_args

    def resolve_tokenizer_args(tokenizer_name, *args, **kwargs):
        if is_glm_dsa_gguf(tokenizer_name):
            tokenizer_name = str(tokenizer_dir_for(tokenizer_name))
        return original(tokenizer_name, *args, **kwargs)

    patch.replace(registry_module, "resolve_tokenizer_args", resolve_tokenizer_args)
    patch.replace(registry_module, "cached_resolve_tokenizer_args", lru_cache(resolve_tokenizer_args))


PATCHES = [
    Patch(
        name="gguf-config",
        target="vllm.transformers_utils.config",
        replaces=("vllm.transformers_utils.config:get_config",
                  "vllm.transformers_utils.config:_CONFIG_REGISTRY['glm_moe_dsa']"),
        summary="a glm-dsa GGUF is its own config source (validated first); --hf-config-path still wins",
        check=_check_config,
        apply=_apply_config,
    ),
    Patch(
        name="gguf-generation-config",
        target="vllm.transformers_utils.config",
        replaces=("vllm.transformers_utils.config:try_get_generation_config",),
        summary="chat turns stop where GLM-5's do: eos = <|endoftext|>, <|user|>, <|observation|> from the GGUF",
        check=_check_generation,
        apply=_apply_generation,
    ),
    Patch(
        name="gguf-tokenizer",
        target="vllm.tokenizers.registry",
        replaces=("vllm.tokenizers.registry:resolve_tokenizer_args",
                  "vllm.tokenizers.registry:cached_resolve_tokenizer_args"),
        summary="tokenizer and chat template rebuilt from the GGUF's tokenizer.ggml.* keys; --tokenizer still wins",
        check=_check_tokenizer,
        apply=_apply_tokenizer,
    ),
]

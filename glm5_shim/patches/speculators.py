"""Speculator detection must not parse a GGUF with transformers.

Target: ``vllm.engine.arg_utils.maybe_override_with_speculators`` — imported *by name* from
``vllm.transformers_utils.config`` and called from ``EngineArgs.create_engine_config`` before the model config
exists.  For a GGUF it asks transformers for the file's config, which raises "GGUF model with architecture glm-dsa
is not supported yet".  A GGUF carries no speculators config, so for GGUF models the replacement returns the
function's own "no speculators" answer (its inputs unchanged).  Both bindings are replaced; the one in arg_utils
is the one actually called.
"""
from __future__ import annotations

import inspect

from glm5_shim.registry import Patch, require, require_attr, require_params, require_names

_NAME = "maybe_override_with_speculators"
_PARAMS = ("model", "tokenizer", "trust_remote_code", "revision", "vllm_speculative_config", "hf_token")


def _check(arg_utils) -> None:
    import vllm.transformers_utils.config as tc
    from vllm.transformers_utils import gguf_utils

    called = require_attr(arg_utils, _NAME, "vllm.engine.arg_utils")
    require_params(called, _PARAMS, f"vllm.engine.arg_utils.{_NAME}")
    require(callable(getattr(gguf_utils, "is_gguf", None)), "vllm.transformers_utils.gguf_utils.is_gguf is missing")
    require_attr(tc, _NAME, "vllm.transformers_utils.config")
    engine_args = require_attr(arg_utils, "EngineArgs", "vllm.engine.arg_utils")
    create = require_attr(engine_args, "create_engine_config", "EngineArgs")
    require_names(create, "EngineArgs.create_engine_config", _NAME, why="it calls it through the module global")


def _make_replacement(original):
    from vllm.transformers_utils.gguf_utils import is_gguf

    signature = inspect.signature(original)

    def maybe_override_with_speculators(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        model = bound.arguments["model"]
        if is_gguf(model):
            return model, bound.arguments.get("tokenizer"), bound.arguments.get("vllm_speculative_config")
        return original(*args, **kwargs)

    return maybe_override_with_speculators


def _apply(arg_utils, patch: Patch) -> None:
    import vllm.transformers_utils.config as tc

    replacement = _make_replacement(getattr(arg_utils, _NAME))  # replace() keeps an existing wrapper
    patch.replace(arg_utils, _NAME, replacement)
    patch.replace(tc, _NAME, replacement)


PATCHES = [
    Patch(
        name="speculators",
        target="vllm.engine.arg_utils",
        replaces=(f"vllm.engine.arg_utils:{_NAME}", f"vllm.transformers_utils.config:{_NAME}"),
        summary="GGUF models skip speculator detection (transformers cannot parse glm-dsa)",
        check=_check,
        apply=_apply,
    )
]

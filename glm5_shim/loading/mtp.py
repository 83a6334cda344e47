"""Whether an MTP speculative draft asked of a glm-dsa GGUF can be served, decided from the file's headers.

vLLM 0.23 runs GLM-5's multi-token-prediction layer as a draft model (`--speculative-config '{"method": "mtp",
"num_speculative_tokens": K}'`): SpeculativeConfig builds the draft's config from the same file with
hf_config_override (glm_moe_dsa → deepseek_mtp, DeepSeekMTPModel, n_predict = num_nextn_predict_layers), and the
shim's loader fills it from the file's blk.{num_hidden_layers} (glm5_shim.gguf.load_plan, draft=True).  A file
without that layer must say so in one line before any GPU memory is taken: launch.sh's preflight and the
SpeculativeConfig hook (glm5_shim.patches.mtp_draft) both ask `mtp_problem`.

No vLLM import here (preflight runs without it): vLLM's method names are read as vLLM 0.23 uses them — "mtp" and
the deprecated per-model names, all ending in "mtp" (vllm/config/speculative.py MTPModelTypes; the patch's target
check verifies that), and "draft_model" / no method with a draft model, which vLLM turns into "mtp" when the draft's
config comes out as deepseek_mtp, as every glm-dsa GGUF's does.
"""
from __future__ import annotations

import os

# A draft of a glm-dsa GGUF is an MTP draft under these methods (None: vLLM infers one from the draft model).
_DRAFT_METHODS = (None, "draft_model")


def is_mtp_method(method: str | None) -> bool:
    """vLLM 0.23's "mtp" or one of its deprecated per-model aliases (deepseek_mtp, glm4_moe_mtp, ...)."""
    return isinstance(method, str) and method.endswith("mtp")


def mtp_draft_gguf(method: str | None, draft_model: str | None, target_model: str | os.PathLike | None) -> str | None:
    """The glm-dsa GGUF vLLM would build an MTP draft from for this --speculative-config, or None (no draft, another
    method, or a model that is no local glm-dsa GGUF: vLLM's business)."""
    from glm5_shim.loading.hf_config import is_glm_dsa_gguf

    if not is_mtp_method(method) and method not in _DRAFT_METHODS:
        return None
    source = draft_model or (target_model if is_mtp_method(method) else None)
    if source is None or not is_glm_dsa_gguf(source):
        return None
    return str(source)


def mtp_problem(method: str | None, draft_model: str | None, target_model: str | os.PathLike | None,
                pipeline_parallel_size: int = 1) -> str | None:
    """The one line that stops an MTP draft of a glm-dsa GGUF that cannot be served, or None.  A file that is bad
    as a model at all gets the validator's line (the same one the target's config raises)."""
    path = mtp_draft_gguf(method, draft_model, target_model)
    if path is None:
        return None
    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.gguf.load_plan import mtp_draft_problem
    from glm5_shim.loading.hf_config import config_dict_from_gguf, gguf_model

    try:
        config = config_dict_from_gguf(path)
    except GGUFError as exc:
        return str(exc)
    problem = mtp_draft_problem(gguf_model(path), config)
    if problem is None and pipeline_parallel_size > 1:
        problem = (f"{path}: an MTP draft of a GGUF needs --pipeline-parallel-size 1, found {pipeline_parallel_size} "
                   f"(vLLM gives the draft the target's embedding only then; the shim does not load it twice)")
    return problem


def mtp_problem_for_speculative_config(value: str | dict | None, target_model: str) -> str | None:
    """mtp_problem for a --speculative-config value as the command line carries it (JSON text or a dict).  A value
    that is no JSON object is left to vLLM's own argument parsing."""
    import json

    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    if value.get("model") is None and value.get("method") is None:
        return None
    return mtp_problem(value.get("method"), value.get("model"), target_model)

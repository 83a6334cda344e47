"""Refuse a tensor-parallel size a glm-dsa GGUF cannot be split at, before any worker starts.

Target: ``vllm.engine.arg_utils:EngineArgs.create_engine_config``.  Every route (``vllm serve``, ``LLM(...)``,
``vllm bench``) builds its VllmConfig there, in the front-end process, before a worker exists or GPU memory is
touched.  The replacement calls vLLM's own method, then, for a glm-dsa GGUF only, checks that every row-parallel
quantized weight (the target's, and its MTP draft's when one is asked for) splits into whole blocks at the configured
tensor-parallel size (see glm5_shim.gguf.tp_split:
vLLM 0.23 cuts packed rows into TP byte ranges and would otherwise compute with pieces of blocks, silently).
"""
from __future__ import annotations

from glm5_shim.registry import Patch, require_attr, require_params

_TARGET = "vllm.engine.arg_utils"


def check_tp_split(vllm_config) -> None:
    """Raise GGUFError (one line) when this config's GGUF cannot be split at its tensor-parallel size: the target
    model's weights, then those of its MTP draft (--speculative-config method mtp) at the draft's size."""
    from glm5_shim.names import HF_MODEL_TYPE, HF_MTP_MODEL_TYPE

    parallel = vllm_config.parallel_config
    _check_one(vllm_config.model_config, parallel, HF_MODEL_TYPE, draft=False)
    spec = getattr(vllm_config, "speculative_config", None)
    draft_config = getattr(spec, "draft_model_config", None)
    if draft_config is not None:
        _check_one(draft_config, getattr(spec, "draft_parallel_config", None) or parallel, HF_MTP_MODEL_TYPE,
                   draft=True)


def _check_one(model_config, parallel, model_type: str, *, draft: bool) -> None:
    if getattr(getattr(model_config, "hf_config", None), "model_type", None) != model_type:
        return
    tp, ep = parallel.tensor_parallel_size, bool(parallel.enable_expert_parallel)
    if tp <= 1:
        return  # nothing is split
    from glm5_shim.loading.hf_config import is_glm_dsa_gguf

    if not is_glm_dsa_gguf(model_config.model):
        return
    from glm5_shim.loading.gguf_loading import load_plan_for
    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.gguf.tp_split import clean_tp_sizes, split_problems

    plan = load_plan_for(model_config.model, draft=draft)
    problems = split_problems(plan, tp, expert_parallel=ep)
    if not problems:
        return
    sizes = [s for s in (1, 2, 4, 8, 16) if s <= max(tp, 8)]
    clean = clean_tp_sizes(plan, sizes, expert_parallel=ep)
    hint = f"; this file splits cleanly at --tensor-parallel-size {', '.join(map(str, clean))}"
    if not ep and all(p.is_expert for p in problems) and not split_problems(plan, tp, expert_parallel=True):
        hint += f", or at {tp} with --enable-expert-parallel"
    if draft:
        hint += " (the MTP draft's layer; without --speculative-config the model does not load it)"
    raise GGUFError(f"glm5-shim: {problems[0].line(str(plan.model.path))}{hint}")


def _check(module) -> None:
    cls = require_attr(module, "EngineArgs", _TARGET)
    require_params(require_attr(cls, "create_engine_config", "EngineArgs"), ("self",),
                   "EngineArgs.create_engine_config")


def _apply(module, patch: Patch) -> None:
    cls = module.EngineArgs
    original = cls.create_engine_config

    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        check_tp_split(config)
        return config

    patch.replace(cls, "create_engine_config", create_engine_config)


PATCHES = [
    Patch(
        name="tp-split-check",
        target=_TARGET,
        replaces=(f"{_TARGET}:EngineArgs.create_engine_config",),
        summary="refuses a --tensor-parallel-size at which a glm-dsa GGUF's quantized row-parallel weights "
                "would be cut inside blocks (vLLM would load wrong weights silently)",
        check=_check,
        apply=_apply,
    ),
]

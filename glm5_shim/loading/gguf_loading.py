"""vLLM-side steps of loading a glm-dsa GGUF: the plan (cached per process), the quant config's unquantized
modules, and the weights stream with vLLM's progress bar.  The same file loads two models: the target
(GlmMoeDsaForCausalLM) and, with --speculative-config method "mtp", vLLM's MTP draft (DeepSeekMTP, draft=True)."""
from __future__ import annotations

import os

from vllm.logger import init_logger

from glm5_shim.loading.hf_config import PerFileCache

logger = init_logger("vllm.glm5_shim.gguf")
_plans = PerFileCache()
_draft_plans = PerFileCache()

# Parameters of vLLM's MTP draft that no checkpoint fills: the proposer replaces them with the target model's
# embedding and lm_head after loading (vllm/v1/spec_decode/llm_base_proposer.py: _maybe_share_embeddings,
# _maybe_share_lm_head; SpeculativeConfig refuses an MTP draft of a GGUF at pipeline-parallel size > 1, where the
# embedding would not be shared).
DRAFT_PARAMETERS_FROM_TARGET = ("model.embed_tokens.", ".shared_head.head.")


def load_plan_for(path: str | os.PathLike, *, draft: bool = False):
    """The target model's plan, or (draft) the plan of vLLM's MTP draft."""
    return (_draft_plans if draft else _plans).get(path, lambda: _plan(path, draft))


def _plan(path: str | os.PathLike, draft: bool):
    from glm5_shim.loading.hf_config import gguf_model
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.errors import GGUFError
    from glm5_shim.gguf.load_plan import mtp_draft_problem, plan_load

    model = gguf_model(path)
    config = build_hf_config(model)
    if draft and (problem := mtp_draft_problem(model, config)):
        raise GGUFError(problem)
    plan = plan_load(model, config, draft=draft)
    for note in plan.notes:
        logger.info("glm5-shim: %s", note)
    return plan


def prepare_quant_config(quant_config, plan) -> None:
    """Modules the loader makes float must be built unquantized (vLLM derives this from F32/F16/BF16 weights)."""
    modules = plan.unquantized_modules()
    existing = set(quant_config.unquantized_modules)
    quant_config.unquantized_modules.extend(m for m in modules if m not in existing)


def load_glm_weights(model, path: str | os.PathLike, load_config, *, draft: bool = False) -> None:
    from vllm.model_executor.model_loader import weight_utils

    from glm5_shim.loading.gguf_weights import check_all_loaded, count_steps, iter_weights

    plan = load_plan_for(path, draft=draft)
    use_tqdm = weight_utils.enable_tqdm(getattr(load_config, "use_tqdm_on_load", True))
    from tqdm.auto import tqdm

    with tqdm(total=count_steps(plan), desc="Loading GGUF tensors" + (" (MTP draft)" if draft else ""),
              disable=not use_tqdm, bar_format=weight_utils._BAR_FORMAT) as progress:
        loaded = model.load_weights(iter_weights(plan, progress))
    check_all_loaded(model, loaded if isinstance(loaded, set) else None, path,
                     filled_elsewhere=DRAFT_PARAMETERS_FROM_TARGET if draft else ())
    _forget_plans()  # drop the readers: their memory maps of a several-hundred-GB file are no longer needed


def repack_weights(model, dtype, *, draft: bool = False):
    """After vLLM's process_weights_after_loading: Q8_0/Q6_K linear and expert weights repacked for the shim's
    kernels (loading/gguf_repack.py), with one log line; None where packing is off or the activations are not
    16-bit (the dtypes the shim's kernels take)."""
    import torch

    from glm5_shim.loading.gguf_repack import packing_enabled, repack_model

    if dtype not in (torch.float16, torch.bfloat16) or not packing_enabled():
        return None
    tally = repack_model(model)
    if tally.tensors:
        logger.info("glm5-shim: %s%s", tally.summary(), " (MTP draft)" if draft else "")
    return tally


def _forget_plans() -> None:
    from glm5_shim.loading.hf_config import forget_gguf_models

    _plans.clear()
    _draft_plans.clear()
    forget_gguf_models()

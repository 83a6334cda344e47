"""vLLM-side steps of loading a glm-dsa GGUF: the plan (cached per process), the quant config's unquantized
modules, and the weights stream with vLLM's progress bar."""
from __future__ import annotations

import os

from vllm.logger import init_logger

from glm5_shim.loading.hf_config import PerFileCache

logger = init_logger("vllm.glm5_shim.gguf")
_plans = PerFileCache()


def load_plan_for(path: str | os.PathLike):
    return _plans.get(path, lambda: _plan(path))


def _plan(path: str | os.PathLike):
    from glm5_shim.loading.hf_config import gguf_model
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.load_plan import plan_load

    model = gguf_model(path)
    plan = plan_load(model, build_hf_config(model))
    for note in plan.notes:
        logger.info("glm5-shim: %s", note)
    return plan


def prepare_quant_config(quant_config, plan) -> None:
    """Modules the loader makes float must be built unquantized (vLLM derives this from F32/F16/BF16 weights)."""
    modules = plan.unquantized_modules()
    existing = set(quant_config.unquantized_modules)
    quant_config.unquantized_modules.extend(m for m in modules if m not in existing)


def load_glm_weights(model, path: str | os.PathLike, load_config) -> None:
    from vllm.model_executor.model_loader import weight_utils

    from glm5_shim.loading.gguf_weights import check_all_loaded, count_steps, iter_weights

    plan = load_plan_for(path)
    use_tqdm = weight_utils.enable_tqdm(getattr(load_config, "use_tqdm_on_load", True))
    from tqdm.auto import tqdm

    with tqdm(total=count_steps(plan), desc="Loading GGUF tensors", disable=not use_tqdm,
              bar_format=weight_utils._BAR_FORMAT) as progress:
        loaded = model.load_weights(iter_weights(plan, progress))
    check_all_loaded(model, loaded if isinstance(loaded, set) else None, path)
    _forget_plans()  # drop the readers: their memory maps of a several-hundred-GB file are no longer needed


def _forget_plans() -> None:
    from glm5_shim.loading.hf_config import forget_gguf_models

    _plans.clear()
    forget_gguf_models()

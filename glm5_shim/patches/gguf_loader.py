"""GLM-5 weights from a glm-dsa GGUF.

Target: ``vllm.model_executor.model_loader.gguf_loader.GGUFModelLoader.load_model`` / ``load_weights``.  For any
model whose hf_config.model_type is ``glm_moe_dsa`` the replacement loads through an explicit plan
(glm5_shim.gguf.load_plan) instead of vLLM's dummy-HF-model name map, which cannot map glm-dsa: kv_b_proj is
rebuilt from attn_k_b/attn_v_b, indexer wk/weights_proj are dequantized, fused groups are made homogeneous,
gate/up experts of different types are fixed, the MTP block is skipped with one log line, tied embeddings are
decided over all shards, after loading any parameter left uninitialised is an error that names it, and Q8_0/Q6_K
linear and expert weights are repacked for the shim's kernels (loading/gguf_repack.py; GLM5_SHIM_GGUF_PACK=0: not).
vLLM's MTP draft of a glm-dsa GGUF (hf_config.model_type ``deepseek_mtp``, what SpeculativeConfig makes of a
glm_moe_dsa config) loads through the draft's plan: the MTP block blk.{num_hidden_layers} only, under the names
DeepSeekMTP.load_weights consumes; its embedding and shared head are left to vLLM's proposer, which gives it the
target's.  vLLM's own GGUF load_model builds a draft with the target's architecture (it does not pass the draft's
model_config to initialize_model); the replacement passes it.
Every other model goes through vLLM's code unchanged.
"""
from __future__ import annotations

import inspect

from glm5_shim.names import HF_MODEL_TYPE as GLM_MODEL_TYPE, HF_MTP_MODEL_TYPE
from glm5_shim.registry import Patch, require, require_attr, require_params


def _check(module) -> None:
    cls = require_attr(module, "GGUFModelLoader", "vllm.model_executor.model_loader.gguf_loader")
    require_params(require_attr(cls, "load_model", "GGUFModelLoader"), ("self", "vllm_config", "model_config"),
                   "GGUFModelLoader.load_model")
    require_params(require_attr(cls, "load_weights", "GGUFModelLoader"), ("self", "model", "model_config"),
                   "GGUFModelLoader.load_weights")
    require_attr(cls, "_prepare_weights", "GGUFModelLoader")
    for name in ("initialize_model", "process_weights_after_loading", "set_default_torch_dtype"):
        require(callable(getattr(module, name, None)), f"gguf_loader no longer imports {name}")
    require("model_config" in inspect.signature(module.initialize_model).parameters,
            "initialize_model no longer takes model_config (needed to build the MTP draft's own architecture)")


def _glm_model(model_config) -> str | None:
    """"target" for GLM-5 itself, "draft" for vLLM's MTP draft of a glm-dsa GGUF, None for any other model."""
    model_type = getattr(getattr(model_config, "hf_config", None), "model_type", None)
    if model_type == GLM_MODEL_TYPE:
        return "target"
    if model_type == HF_MTP_MODEL_TYPE:
        from glm5_shim.loading.hf_config import is_glm_dsa_gguf

        if is_glm_dsa_gguf(model_config.model):
            return "draft"
    return None


def _apply(module, patch: Patch) -> None:
    cls = module.GGUFModelLoader
    original_load_model = cls.load_model
    original_load_weights = cls.load_weights

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        which = _glm_model(model_config)
        if which is None:
            return original_load_model(self, vllm_config, model_config, prefix)
        import torch

        from glm5_shim.loading.gguf_loading import load_plan_for, prepare_quant_config, repack_weights
        from glm5_shim.matmul.gguf_ops import mark_glm_gguf_loaded

        mark_glm_gguf_loaded()  # this process's GGUF matmuls are GLM-5's: the shim's kernels take them
        plan = load_plan_for(self._prepare_weights(model_config), draft=which == "draft")
        if plan.tied_embeddings and which == "target":
            model_config.hf_config.update({"tie_word_embeddings": True})
        prepare_quant_config(vllm_config.quant_config, plan)
        target_device = torch.device(vllm_config.device_config.device)
        with module.set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = module.initialize_model(vllm_config=vllm_config, prefix=prefix, model_config=model_config)
            self.load_weights(model, model_config)
            module.process_weights_after_loading(model, model_config, target_device)
            repack_weights(model, model_config.dtype, draft=which == "draft")
        return model

    def load_weights(self, model, model_config) -> None:
        which = _glm_model(model_config)
        if which is None:
            return original_load_weights(self, model, model_config)
        from glm5_shim.loading.gguf_loading import load_glm_weights

        load_glm_weights(model, self._prepare_weights(model_config), self.load_config, draft=which == "draft")

    patch.replace(cls, "load_model", load_model)
    patch.replace(cls, "load_weights", load_weights)


PATCHES = [
    Patch(
        name="gguf-loader",
        target="vllm.model_executor.model_loader.gguf_loader",
        replaces=("vllm.model_executor.model_loader.gguf_loader:GGUFModelLoader.load_model",
                  "vllm.model_executor.model_loader.gguf_loader:GGUFModelLoader.load_weights"),
        summary="glm-dsa weights through an explicit plan (kv_b rebuild, float indexer; the MTP block only into "
                "vLLM's MTP draft); fails naming any parameter left unloaded",
        check=_check,
        apply=_apply,
    )
]

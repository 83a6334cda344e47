"""An MTP draft asked of a glm-dsa GGUF that cannot serve one stops with one line before the draft's config exists.

Target: ``vllm.config.speculative.SpeculativeConfig.__post_init__``.  With ``--speculative-config '{"method": "mtp",
...}'`` vLLM builds the draft's ModelConfig from the target's own file, with ``SpeculativeConfig.hf_config_override``
turning the glm_moe_dsa config into deepseek_mtp (DeepSeekMTPModel, n_predict = num_nextn_predict_layers); the
shim's config hook builds that config from the GGUF and its loader fills the draft from the file's MTP layer.  A file
without the layer would fail inside vLLM: "integer modulo by zero" (n_predict 0, a ``--no-mtp`` file), or, for a file
that declares the layer without its tensors, only when the draft loads, after the target took its GPU memory.  The
replacement asks glm5_shim.loading.mtp first and raises its one line (GGUFError) for such a file; every other
speculative config goes to vLLM's ``__post_init__`` unchanged.  The check verifies the premise: vLLM still maps a
glm_moe_dsa config to deepseek_mtp / DeepSeekMTPModel with n_predict, every MTP method name still ends in "mtp",
and ``__post_init__`` still drafts from the target's own model for method "mtp".
"""
from __future__ import annotations

import typing

from glm5_shim.registry import Patch, require, require_attr, require_source

_TARGET = "vllm.config.speculative"


def _check(module) -> None:
    cls = require_attr(module, "SpeculativeConfig", _TARGET)
    override = require_attr(cls, "hf_config_override", "SpeculativeConfig")
    post_init = require_attr(cls, "__post_init__", "SpeculativeConfig")
    require_source(post_init, "SpeculativeConfig.__post_init__", "self.model = self.target_model_config.model",
                   "hf_overrides=SpeculativeConfig.hf_config_override")
    methods = typing.get_args(require_attr(module, "MTPModelTypes", _TARGET))
    require("mtp" in methods and all(m.endswith("mtp") for m in methods),
            f"vLLM's MTP method names no longer all end in 'mtp': {methods}")
    from glm5_shim.loading.hf_config import glm_moe_dsa_config_class
    from glm5_shim.names import HF_MTP_ARCHITECTURE, HF_MTP_MODEL_TYPE

    probe = override(glm_moe_dsa_config_class()(num_nextn_predict_layers=1, architectures=["GlmMoeDsaForCausalLM"]))
    got = (probe.model_type, list(probe.architectures), getattr(probe, "n_predict", None))
    require(got == (HF_MTP_MODEL_TYPE, [HF_MTP_ARCHITECTURE], 1),
            f"SpeculativeConfig.hf_config_override turns a glm_moe_dsa config into {got}, expected "
            f"({HF_MTP_MODEL_TYPE!r}, [{HF_MTP_ARCHITECTURE!r}], 1)")


def _apply(module, patch: Patch) -> None:
    cls = module.SpeculativeConfig
    stock_post_init = cls.__post_init__

    def __post_init__(self):
        from glm5_shim.loading.mtp import mtp_problem

        target = getattr(self, "target_model_config", None)
        parallel = getattr(self, "target_parallel_config", None)
        problem = mtp_problem(self.method, self.model, getattr(target, "model", None),
                              getattr(parallel, "pipeline_parallel_size", 1) or 1)
        if problem is not None:
            from glm5_shim.gguf.errors import GGUFError

            raise GGUFError(problem)
        return stock_post_init(self)

    patch.replace(cls, "__post_init__", __post_init__)


PATCHES = [
    Patch(
        name="mtp-draft",
        target=_TARGET,
        replaces=(f"{_TARGET}:SpeculativeConfig.__post_init__",),
        summary="--speculative-config method mtp with a glm-dsa GGUF: a file without its MTP layer stops with one "
                "line before the draft is built (the draft itself loads through gguf-loader)",
        check=_check,
        apply=_apply,
    ),
]

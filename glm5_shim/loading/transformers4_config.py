"""GlmMoeDsaConfig for transformers < 5.2, which lacks it.  Module-level so that configs pickle by reference
(vLLM sends its config to the engine-core and worker processes)."""
from transformers import DeepseekV3Config

from glm5_shim.names import HF_MODEL_TYPE


class GlmMoeDsaConfig(DeepseekV3Config):
    """GLM-5 (glm_moe_dsa): DeepSeek-V3 geometry plus DSA indexer fields; vLLM only reads attributes."""

    model_type = HF_MODEL_TYPE

"""The names GLM-5 goes by, one home each.  Plain strings, because the patches import them at activation, where the
gguf package must not be imported (tests/gguf/test_names.py checks them against gguf-py's and transformers' tables)."""

GGUF_ARCH = "glm-dsa"  # gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GLM_DSA]: general.architecture of every GLM-5.x GGUF
HF_MODEL_TYPE = "glm_moe_dsa"  # transformers' GlmMoeDsaConfig.model_type; vLLM's model registry key
HF_ARCHITECTURE = "GlmMoeDsaForCausalLM"
# vLLM 0.23's MTP draft of a glm_moe_dsa target: SpeculativeConfig.hf_config_override gives the draft's config this
# model_type and architecture (vllm/config/speculative.py), which vLLM's registry maps to deepseek_mtp.DeepSeekMTP.
HF_MTP_MODEL_TYPE = "deepseek_mtp"
HF_MTP_ARCHITECTURE = "DeepSeekMTPModel"

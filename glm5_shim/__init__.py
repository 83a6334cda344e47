"""glm5-shim: serve GLM-5 (glm-dsa) llama.cpp GGUFs in vLLM 0.23 on GPUs without a native sparse-MLA path."""
__version__ = "0.1.0"

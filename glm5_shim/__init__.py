"""glm5-shim: serve GLM-5 (glm-dsa) llama.cpp GGUFs in vLLM 0.23 on GPUs without a native sparse-MLA path.

Importing this package is cheap and patches nothing; :func:`activate` arms the lazy patching.
"""
__version__ = "0.1.0"


def activate(source: str = "api") -> str:
    from glm5_shim.activation import activate as _activate

    return _activate(source)


def activate_from_vllm_plugin() -> None:
    """Entry point of the ``vllm.general_plugins`` group: vLLM calls it in every process it starts."""
    try:
        activate("vllm-plugin")
    except Exception as exc:  # never break vLLM's plugin loading
        import sys

        sys.stderr.write(f"glm5-shim: WARNING: activation from the vLLM plugin failed: {exc}\n")

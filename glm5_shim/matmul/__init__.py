"""vLLM's GGUF matmul calls routed to the shim's kernels (the vLLM glue of ``glm5_shim/kernels/gguf/tiles.py``)."""

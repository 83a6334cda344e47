"""vLLM glue for loading a glm-dsa GGUF: the HF config and tokenizer from its headers, the load plan, and the weight
stream vLLM consumes."""

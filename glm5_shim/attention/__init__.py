"""vLLM glue for attention: the shim's sparse-MLA backend, what vLLM would select, and GLM-5.2's
shared-indexer stand-in."""

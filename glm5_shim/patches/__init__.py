"""One module per vLLM patch point.  Each declares ``PATCHES``: the patch records, with no vLLM import at
module level (the target is a module name; the checks and replacements import what they need when they run)."""
from __future__ import annotations

import importlib

# Order matters only for reading doctor's output: it follows a request's path through vLLM.
PATCH_MODULES = (
    "speculators",
    "gguf_config",
    "mtp_draft",
    "dtype_gate",
    "gguf_loader",
    "gguf_shard_order",
    "gguf_kernels",
    "shared_indexer",
    "mtp_fp16",
    "mtp_prompt_logprobs",
    "tp_split_check",
    "attention_selector",
    "indexer",
)


def load_all(registry):
    for name in PATCH_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        for patch in module.PATCHES:
            registry.add(patch)
    return registry.patches()

"""Pure GGUF logic for GLM-5 (llama.cpp arch `glm-dsa`): reading, config, tensor map, checks, test models.

Importable without vLLM; only numpy and gguf are imported eagerly (tokenizers, transformers, safetensors
and torch are imported inside the functions that need them).

  reader      open_gguf(path) → GGUFModel (single file or shard set, header checks)
  config      build_hf_config(model) → HF glm_moe_dsa config dict
  tensor_map  build_tensor_map(config) → GGUF name → HF name, shape, role
  kv_b        rebuild_kv_b / split_kv_b
  dequant     dequantize(tensor) → float32; the GGML types vLLM 0.23 runs
  type_policy which GGML types each tensor may have and what the loader does with each (validate, load_plan
              and report apply it)
  load_plan   plan_load(model, config) → every tensor's action
  validate    validate(path) → [Finding], check(path)
  tokenizer   build_hf_tokenizer(path), save_tokenizer_dir(path, out_dir)
  fixture     make_tiny(out_path, ...) → tiny random glm-dsa GGUF + reference weights (a package: one module a job)
  slice       make_slice(out_path, layers, dense_layers, preset, ...) → a random GLM-5 slice at the real sizes
              (streamed; one tensor-parallel rank with rank_of)
  report      inspect_report(path), format_report(report)  (python -m glm5_shim inspect)
  memory      longest_context(config, weight_bytes, kv_dtype) → the longest --max-model-len that fits a GPU
"""

from .config import build_hf_config, config_shape_problems
from .dequant import VLLM_DEQUANT_TYPES, VLLM_RUNNABLE_TYPES, VLLM_UNQUANTIZED_TYPES, can_dequantize, dequantize
from .errors import GGUFError
from .kv_b import rebuild_kv_b, split_kv_b
from .reader import GGUFModel, TensorInfo, open_gguf
from .tensor_map import (ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_MTP, ROLE_NORMAL, ROLE_REBUILD_KV_B, TensorMap,
                         TensorSpec, build_tensor_map)
from .validate import Finding, check, validate

__all__ = [
    "GGUFError", "GGUFModel", "TensorInfo", "open_gguf", "build_hf_config", "config_shape_problems",
    "build_tensor_map", "TensorMap", "TensorSpec", "ROLE_NORMAL", "ROLE_REBUILD_KV_B", "ROLE_FORCE_FLOAT",
    "ROLE_EXPERTS", "ROLE_MTP", "rebuild_kv_b", "split_kv_b", "dequantize", "can_dequantize",
    "VLLM_UNQUANTIZED_TYPES", "VLLM_DEQUANT_TYPES", "VLLM_RUNNABLE_TYPES", "validate", "check", "Finding",
]

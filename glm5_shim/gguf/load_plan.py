"""What the loader does with each tensor of a glm-dsa GGUF, decided from headers only (no tensor data).

One place holds the policy, so the validator, `inspect` and the vLLM loader agree:

  keep        quantized tensor of a type vLLM 0.23 runs: raw blocks go to vLLM's GGUF kernels
  float       F32/F16/BF16 tensor loaded as a plain weight
  dequantize  made float on the CPU: modules vLLM builds unquantized (indexer wk, weights_proj), a quantized
              member of a fused group whose other member is float (q_a+kv_a, gate+up), and any linear weight of a
              type vLLM 0.23 cannot run
  requantize  routed experts vLLM cannot take as they are (float experts: vLLM 0.23 only runs quantized GGUF
              experts; gate/up of different types: vLLM keeps one type for both) → Q8_0, the gguf package's
              near-lossless quantizer
  kv_b        attn_k_b / attn_v_b (or a legacy attn_kv_b): rebuilt into one float kv_b_proj weight
  skip        the multi-token-prediction block (not used yet), indexer weights of a layer that shares the previous
              full layer's top-k (GLM-5.2: vLLM builds no indexer there), and tensors GLM-5 does not use
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import indexer_layout
from .dequant import VLLM_DEQUANT_TYPES, can_dequantize, is_float_type
from .errors import GGUFError
from .reader import GGUFModel, TensorInfo
from .tensor_map import ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_MTP, ROLE_REBUILD_KV_B, ROLE_SHARED_INDEXER, TensorMap, \
    TensorSpec, build_tensor_map, known_unused_tensor

KEEP, FLOAT, DEQUANTIZE, REQUANTIZE, KV_B, SKIP = "keep", "float", "dequantize", "requantize", "kv_b", "skip"
REQUANTIZE_TYPE = "Q8_0"


@dataclass
class PlannedTensor:
    info: TensorInfo
    spec: TensorSpec | None
    action: str
    hf_name: str | None
    why: str = ""

    @property
    def gguf_name(self) -> str:
        return self.info.name

    @property
    def vllm_type(self) -> str | None:
        """The GGML type name vLLM receives this tensor as (F32 for everything the loader makes float); None when
        the loader skips it."""
        if self.action == SKIP or self.hf_name is None:
            return None
        if self.action in (KEEP, FLOAT):
            return self.info.type_name
        if self.action == REQUANTIZE:
            return REQUANTIZE_TYPE
        return "F32"


@dataclass
class LoadPlan:
    model: GGUFModel
    config: dict
    tensor_map: TensorMap
    tensors: list[PlannedTensor]
    notes: list[str] = field(default_factory=list)  # one line each: what the loader works around

    @property
    def tied_embeddings(self) -> bool:
        return "output.weight" not in self.model

    def weight_types(self) -> dict[str, str]:
        """HF weight name → GGML type name as vLLM should see it (float for everything the loader makes float)."""
        return {t.hf_name: vllm_type for t in self.tensors if (vllm_type := t.vllm_type) is not None}

    def unquantized_modules(self) -> list[str]:
        """Module prefixes vLLM must build unquantized (what its GGUF loader derives from F32/F16/BF16 weights)."""
        return sorted({name.removesuffix(".weight") for name, t in self.weight_types().items()
                       if t in ("F32", "F16", "BF16") and name.endswith(".weight")})

    def stream_order(self) -> list[PlannedTensor]:
        """The tensors in the order the loader hands them to vLLM: file order, except that the members of a fused
        module are brought together at the first member's place, in shard order.  vLLM 0.23 concatenates a
        quantized fused linear's shards in arrival order, and llama.cpp writes attn_kv_a_mqa before attn_q_a."""
        first: dict[str, int] = {}
        keys = []
        for i, t in enumerate(self.tensors):
            group = t.spec.fused_group if t.spec is not None else None
            if group is None:
                keys.append((i, 0))
            else:
                keys.append((first.setdefault(group, i), t.spec.fused_shard))
        return [t for _, t in sorted(zip(keys, self.tensors), key=lambda kt: kt[0])]

    def by_action(self, action: str) -> list[PlannedTensor]:
        return [t for t in self.tensors if t.action == action]


def plan_load(model: GGUFModel, config: dict) -> LoadPlan:
    """Decide every tensor's treatment.  Raises GGUFError (one line) for what no treatment can fix."""
    tmap = build_tensor_map(config, include_mtp=True)
    planned: list[PlannedTensor] = []
    where = str(model.path)
    for info in model:
        spec = tmap.get(info.name)
        if spec is None:
            if known_unused_tensor(info.name):
                planned.append(PlannedTensor(info, None, SKIP, None, "not used by GLM-5"))
                continue
            raise GGUFError(f"{info.path}: tensor {info.name} is not part of a glm-dsa model "
                            f"(expected only the tensors of llama.cpp's glm-dsa layout)")
        planned.append(_plan_one(info, spec, where))
    plan = LoadPlan(model, config, tmap, planned)
    _homogenize_fused_groups(plan)
    _match_gate_up_experts(plan)
    _check_kv_b_complete(plan)
    plan.notes.append("DSA indexer: " + indexer_layout(model, config["num_hidden_layers"]).describe())
    skipped = plan.by_action(SKIP)
    mtp_count = sum(1 for t in skipped if t.spec is not None and t.spec.role == ROLE_MTP)
    if mtp_count:
        layer = config["num_hidden_layers"]
        plan.notes.append(f"skipping {mtp_count} tensors of the multi-token-prediction block blk.{layer} "
                          "(MTP speculative decoding is not supported yet)")
    unused = sorted({t.spec.layer for t in skipped if t.spec is not None and t.spec.role == ROLE_SHARED_INDEXER})
    if unused:
        plan.notes.append(f"ignoring the indexer tensors of {len(unused)} shared-indexer layer(s) "
                          f"({', '.join(map(str, unused))}): they reuse the previous full layer's top-k")
    return plan


def _plan_one(info: TensorInfo, spec: TensorSpec, where: str) -> PlannedTensor:
    tname = info.type_name
    loc = f"{info.path}: tensor {info.name}"
    if spec.role == ROLE_MTP:
        return PlannedTensor(info, spec, SKIP, spec.hf_name, "MTP block")
    if spec.role == ROLE_SHARED_INDEXER:
        return PlannedTensor(info, spec, SKIP, spec.hf_name,
                             "shared-indexer layer: reuses the previous full layer's top-k")
    if tuple(info.shape) != tuple(spec.shape):
        raise GGUFError(f"{loc}: shape {list(info.shape)}, expected {list(spec.shape)} from the metadata")
    if spec.role == ROLE_REBUILD_KV_B:
        _require_dequantizable(info, loc)
        return PlannedTensor(info, spec, KV_B, spec.hf_name, "rebuilt into kv_b_proj")
    if spec.role == ROLE_FORCE_FLOAT:
        _require_dequantizable(info, loc)
        action = FLOAT if tname in ("F32", "F16", "BF16") else DEQUANTIZE
        return PlannedTensor(info, spec, action, spec.hf_name, "vLLM builds this module unquantized")
    if spec.role == ROLE_EXPERTS:
        if is_float_type(tname):
            return PlannedTensor(info, spec, REQUANTIZE, spec.hf_name,
                                 f"vLLM 0.23 runs only quantized GGUF experts; {tname} → {REQUANTIZE_TYPE}")
        if tname not in VLLM_DEQUANT_TYPES:
            raise GGUFError(f"{loc}: type {tname} is not supported by vLLM 0.23's GGUF MoE kernels, expected one "
                            f"of {', '.join(sorted(VLLM_DEQUANT_TYPES))} (routed experts must stay quantized)")
        return PlannedTensor(info, spec, KEEP, spec.hf_name)
    # normal
    if is_float_type(tname):
        return PlannedTensor(info, spec, FLOAT, spec.hf_name)
    if spec.float_only:
        raise GGUFError(f"{loc}: type {tname}, expected F32/F16/BF16 (llama.cpp never quantizes this tensor)")
    if tname in VLLM_DEQUANT_TYPES:
        return PlannedTensor(info, spec, KEEP, spec.hf_name)
    _require_dequantizable(info, loc)
    return PlannedTensor(info, spec, DEQUANTIZE, spec.hf_name,
                         f"type {tname} has no vLLM 0.23 kernel; dequantized to float")


def _require_dequantizable(info: TensorInfo, loc: str) -> None:
    if not can_dequantize(info.ggml_type):
        raise GGUFError(f"{loc}: type {info.type_name} cannot be dequantized by the gguf package, "
                        "expected a type gguf.quants can dequantize")


def _homogenize_fused_groups(plan: LoadPlan) -> None:
    groups: dict[str, list[PlannedTensor]] = {}
    for t in plan.tensors:
        if t.action != SKIP and t.spec is not None and t.spec.fused_group:
            groups.setdefault(t.spec.fused_group, []).append(t)
    for group, members in groups.items():
        floats = [m for m in members if m.action in (FLOAT, DEQUANTIZE)]
        if floats and len(floats) < len(members):
            for m in members:
                if m.action == KEEP:
                    m.action, m.why = DEQUANTIZE, "fused with a float tensor; vLLM needs one precision per module"
            plan.notes.append(f"{group}: mixed float/quantized members ({', '.join(m.gguf_name for m in members)}); "
                              "the quantized ones are dequantized so the fused module is float")


def _match_gate_up_experts(plan: LoadPlan) -> None:
    by_layer: dict[int, dict[str, PlannedTensor]] = {}
    for t in plan.tensors:
        if t.action in (KEEP, REQUANTIZE) and t.spec is not None and t.spec.role == ROLE_EXPERTS:
            kind = t.gguf_name.rsplit(".", 2)[-2]  # ffn_gate_exps / ffn_up_exps / ffn_down_exps
            by_layer.setdefault(t.spec.layer, {})[kind] = t
    for layer, parts in sorted(by_layer.items()):
        gate, up = parts.get("ffn_gate_exps"), parts.get("ffn_up_exps")
        if gate is None or up is None:
            continue
        out_gate = REQUANTIZE_TYPE if gate.action == REQUANTIZE else gate.info.type_name
        out_up = REQUANTIZE_TYPE if up.action == REQUANTIZE else up.info.type_name
        if out_gate != out_up:
            for t in (gate, up):
                if t.action == KEEP:
                    t.action = REQUANTIZE
                    t.why = f"gate/up experts must share one type in vLLM 0.23 ({gate.info.type_name} vs " \
                            f"{up.info.type_name}); → {REQUANTIZE_TYPE}"
            plan.notes.append(f"blk.{layer}: ffn_gate_exps is {gate.info.type_name} but ffn_up_exps is "
                              f"{up.info.type_name}; vLLM 0.23 keeps one type for both, so both are re-quantized "
                              f"to {REQUANTIZE_TYPE} at load (slower start, more memory)")


def _check_kv_b_complete(plan: LoadPlan) -> None:
    parts: dict[int, set[str]] = {}
    for t in plan.by_action(KV_B):
        parts.setdefault(t.spec.layer, set()).add(t.gguf_name.rsplit(".", 2)[-2])
    for layer in range(plan.config["num_hidden_layers"]):
        have = parts.get(layer, set())
        if "attn_kv_b" in have or {"attn_k_b", "attn_v_b"} <= have:
            continue
        missing = sorted({"attn_k_b", "attn_v_b"} - have)
        raise GGUFError(f"{plan.model.path}: tensor blk.{layer}.{missing[0]}.weight is missing "
                        "(expected attn_k_b and attn_v_b, or a legacy attn_kv_b, to rebuild kv_b_proj)")


def describe(plan: LoadPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in plan.tensors:
        counts[t.action] = counts.get(t.action, 0) + 1
    return counts

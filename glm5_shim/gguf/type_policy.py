"""The GGML types each tensor of a glm-dsa GGUF may have, and what the loader does with each: the one home of that
policy.  The validator turns it into findings, the load plan into actions, `inspect` into weight memory; a change
of policy is an edit here.

Actions (load_plan.PlannedTensor.action):

  keep        quantized tensor of a type vLLM 0.23 runs: raw blocks go to vLLM's GGUF kernels
  float       F32/F16/BF16 tensor loaded as a plain weight
  dequantize  made float on the CPU: modules vLLM builds unquantized (indexer wk, weights_proj), a quantized
              member of a fused group whose other member is float (q_a+kv_a, gate+up), and any linear weight of a
              type vLLM 0.23 cannot run
  requantize  routed experts vLLM cannot take as they are (float experts: vLLM 0.23 only runs quantized GGUF
              experts; gate/up of different types: vLLM keeps one type for both) → Q8_0, the gguf package's
              near-lossless quantizer
  kv_b        attn_k_b / attn_v_b (or a legacy attn_kv_b): rebuilt into one float kv_b_proj weight
  skip        in the target model: the multi-token-prediction block (vLLM's MTP draft loads it), indexer weights of
              a layer that shares the previous full layer's top-k (GLM-5.2: vLLM builds no indexer there), and
              tensors GLM-5 does not use; in the MTP draft: everything outside its block, and the block's own
              embedding / shared head (vLLM's proposer gives the draft the target's)

Per tensor (`treatment`), from the tensor table's role and float_only flag and the tensor's type:

  float_only (norms, router, biases)   F32/F16/BF16 → float; anything else refused
  rebuild-kv_b                         any type the gguf package can dequantize → kv_b; else refused
  force-float (indexer wk, proj,       F32/F16/BF16 → float; other dequantizable types → dequantize; else refused
    the MTP block's eh_proj)
  experts                              a vLLM quant type → keep; F32/F16/BF16 → requantize (warned; rows must be
                                       whole Q8_0 blocks); else refused
  normal (and from-target)             F32/F16/BF16 → float; a vLLM quant type → keep; another dequantizable type
                                       → dequantize (warned, with its cost); else refused

Across tensors (`settle_groups`), on the tensors the loader loads: a fused group (TensorSpec.fused_group) that would
load partly float and partly quantized has its quantized members dequantized; routed gate/up experts of one layer
that would reach vLLM as different types are both re-quantized.  A tensor such a rule must convert but the gguf
package cannot dequantize is refused.

A type whose blocks do not tile a row (`row_problem`) fits no tensor.  Each refusal and warning is one clause
("type X ..., expected ..."); the caller puts the file and tensor in front.
Pure rules: no model file, no vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import gguf

from .dequant import VLLM_DEQUANT_TYPES, VLLM_UNQUANTIZED_TYPES, can_dequantize, is_float_type
from .tensor_map import ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_FROM_TARGET, ROLE_MTP, ROLE_REBUILD_KV_B, \
    ROLE_SHARED_INDEXER, TensorSpec

KEEP, FLOAT, DEQUANTIZE, REQUANTIZE, KV_B, SKIP = "keep", "float", "dequantize", "requantize", "kv_b", "skip"
ACTIONS = (KEEP, FLOAT, DEQUANTIZE, REQUANTIZE, KV_B, SKIP)
REQUANTIZE_TYPE = "Q8_0"
# What vLLM receives as a float weight (bfloat16 on the GPU).
FLOAT_ACTIONS = frozenset({FLOAT, DEQUANTIZE, KV_B})
GPU_FLOAT_BYTES = 2  # bfloat16

_FLOAT_NAMES = "/".join(t for t in ("F32", "F16", "BF16") if t in VLLM_UNQUANTIZED_TYPES)
_QUANT_NAMES = "/".join(sorted(VLLM_DEQUANT_TYPES))
_NOT_DEQUANTIZABLE = "cannot be dequantized by the gguf package, expected a type gguf.quants can dequantize"


@dataclass(frozen=True)
class Treatment:
    """What the loader does with one tensor: an action, or None when no action can serve its type."""

    action: str | None
    reason: str = ""  # refused: what is wrong ("type X ..., expected ..."); otherwise why (may be empty)
    warn: bool = False  # accepted, but the validator warns: the loader works around the type

    @property
    def refused(self) -> bool:
        return self.action is None


@dataclass(frozen=True)
class GroupNote:
    """One group the cross-tensor rules changed: a warning, or a refusal naming the tensor that cannot be converted."""

    tensor: str  # the first member (or the refused one)
    message: str  # one line, without the file
    refused: bool = False


def skip_reason(spec: TensorSpec, *, draft: bool = False) -> str | None:
    """Why the loader skips this tensor of the table whatever its type; None when it loads it.  draft: the loader
    is loading vLLM's MTP draft (DeepSeekMTP) rather than the target model."""
    if draft:
        if spec.role != ROLE_MTP:
            return "the target model's tensor (the MTP draft holds only its own block)"
        if spec.base_role == ROLE_FROM_TARGET:
            return "vLLM's MTP proposer gives the draft the target model's embedding and lm_head"
        return None
    if spec.role == ROLE_MTP:
        return "MTP block (loaded by the MTP draft: --speculative-config method mtp)"
    if spec.role == ROLE_SHARED_INDEXER:
        return "shared-indexer layer: reuses the previous full layer's top-k"
    return None


def row_problem(info: Any) -> str | None:
    """A type fits a tensor only when each row (`info`: type_name, shape in numpy order) is whole blocks of it."""
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[info.type_name]][0]
    if info.shape and info.shape[-1] % block:
        return f"row length {info.shape[-1]} is not a multiple of the {info.type_name} block size {block}"
    return None


def treatment(spec: TensorSpec, info: Any) -> Treatment:
    """The treatment of a tensor (`info`: type_name, shape, n_elements) as its table entry outside the MTP block
    (spec.base_role) would get it; skipping (`skip_reason`), the shape and `row_problem` are the caller's to check
    first."""
    type_name = info.type_name
    is_float = is_float_type(type_name)
    role = spec.base_role
    if spec.float_only:
        if is_float:
            return Treatment(FLOAT)
        return Treatment(None, f"type {type_name} is not allowed, expected {_FLOAT_NAMES} (llama.cpp never quantizes "
                               f"this tensor; vLLM loads it unquantized)")
    if role in (ROLE_REBUILD_KV_B, ROLE_FORCE_FLOAT):
        if not can_dequantize(type_name):
            return Treatment(None, f"type {type_name} {_NOT_DEQUANTIZABLE} (the loader makes this tensor float)")
        if role == ROLE_REBUILD_KV_B:
            return Treatment(KV_B, "rebuilt into kv_b_proj")
        return Treatment(FLOAT if is_float else DEQUANTIZE, "vLLM builds this module unquantized")
    if role == ROLE_EXPERTS:
        if is_float:
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[REQUANTIZE_TYPE]][0]
            if info.shape[-1] % block:
                return Treatment(None, f"row length {info.shape[-1]} of {type_name} routed experts is not a multiple "
                                       f"of the {REQUANTIZE_TYPE} block size {block}, expected whole blocks (vLLM "
                                       f"0.23 runs only quantized GGUF experts: the loader re-quantizes float ones)")
            return Treatment(REQUANTIZE, f"routed experts are {type_name}; vLLM 0.23's GGUF MoE method runs only "
                                         f"quantized experts, so the loader re-quantizes them to {REQUANTIZE_TYPE}",
                             warn=True)
        if type_name not in VLLM_DEQUANT_TYPES:
            return Treatment(None, f"type {type_name} is not supported by vLLM 0.23's GGUF MoE kernels, expected one "
                                   f"of {_FLOAT_NAMES} or {_QUANT_NAMES} (routed experts must stay quantized)")
        return Treatment(KEEP)
    # a linear weight (or the embedding)
    if is_float:
        return Treatment(FLOAT)
    if type_name in VLLM_DEQUANT_TYPES:
        return Treatment(KEEP)
    if not can_dequantize(type_name):
        return Treatment(None, f"type {type_name} is not supported by vLLM 0.23's GGUF kernels, expected one of "
                               f"{_FLOAT_NAMES} or {_QUANT_NAMES} (nor can the gguf package dequantize it)")
    extra_mib = info.n_elements * GPU_FLOAT_BYTES / 2**20
    return Treatment(DEQUANTIZE, f"type {type_name} has no vLLM 0.23 kernel; the loader dequantizes it to a float "
                                 f"weight (+{extra_mib:.0f} MiB at 16 bits)", warn=True)


def loaded_type(action: str, type_name: str) -> str | None:
    """The GGML type name vLLM receives a tensor of `type_name` as after `action` (F32 for everything the loader
    makes float); None when the loader skips it."""
    if action == SKIP:
        return None
    if action in (KEEP, FLOAT):
        return type_name
    if action == REQUANTIZE:
        return REQUANTIZE_TYPE
    return "F32"


def gpu_bytes(action: str, info: Any) -> int:
    """Bytes the tensor (`info`: type_name, n_elements, n_bytes) takes on the GPUs after `action`: float weights
    as bfloat16, quantized ones as their GGUF blocks."""
    if action == SKIP:
        return 0
    if action in FLOAT_ACTIONS or (action == KEEP and is_float_type(info.type_name)):
        return info.n_elements * GPU_FLOAT_BYTES
    if action == REQUANTIZE:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[REQUANTIZE_TYPE]]
        return info.n_elements // block * size
    return info.n_bytes


def _made_float(type_name: str, why: str) -> Treatment:
    if not can_dequantize(type_name):
        return Treatment(None, f"type {type_name} {_NOT_DEQUANTIZABLE} ({why})")
    return Treatment(DEQUANTIZE, why)


def _requantized(type_name: str, why: str) -> Treatment:
    if not can_dequantize(type_name):
        return Treatment(None, f"type {type_name} {_NOT_DEQUANTIZABLE} ({why})")
    return Treatment(REQUANTIZE, why)


def settle_groups(loaded: Iterable[tuple[TensorSpec, Any, Treatment]]) -> tuple[dict[str, Treatment], list[GroupNote]]:
    """The rules across tensors.  `loaded`: (spec, info, treatment) of each tensor the loader loads (neither skipped
    nor refused), in file order.  Returns the changed treatments by GGUF name and one note per group changed."""
    loaded = list(loaded)
    changes: dict[str, Treatment] = {}
    notes: list[GroupNote] = []

    groups: dict[str, list[tuple[TensorSpec, Any, Treatment]]] = {}
    for item in loaded:
        if item[0].fused_group:
            groups.setdefault(item[0].fused_group, []).append(item)
    for group, members in groups.items():
        if len({t.action in FLOAT_ACTIONS for _, _, t in members}) < 2:
            continue
        why = f"fused with a float tensor in {group}; vLLM needs one precision per module"
        converted = {info.name: _made_float(info.type_name, why) for _, info, t in members if t.action == KEEP}
        changes.update(converted)
        refused = [(name, t) for name, t in converted.items() if t.refused]
        notes += [GroupNote(name, f"tensor {name}: {t.reason}", refused=True) for name, t in refused]
        if not refused:
            listing = ", ".join(f"{info.name}={info.type_name}" for _, info, _ in members)
            notes.append(GroupNote(members[0][1].name, f"tensors {listing} form vLLM's fused {group} but would not "
                                                       f"all load quantized or all float; the loader dequantizes "
                                                       f"the quantized ones"))

    experts: dict[int | None, dict[str, tuple[Any, Treatment]]] = {}
    for spec, info, t in loaded:
        for kind in ("ffn_gate_exps", "ffn_up_exps"):
            if spec.base_role == ROLE_EXPERTS and spec.gguf_name.endswith(f".{kind}.weight"):
                experts.setdefault(spec.layer, {})[kind] = (info, t)
    for _, parts in sorted(experts.items()):
        if len(parts) < 2:
            continue
        (gate, gate_t), (up, up_t) = parts["ffn_gate_exps"], parts["ffn_up_exps"]
        if loaded_type(gate_t.action, gate.type_name) == loaded_type(up_t.action, up.type_name):
            continue
        why = (f"gate/up experts must share one type in vLLM 0.23 ({gate.type_name} vs {up.type_name}); "
               f"→ {REQUANTIZE_TYPE}")
        converted = {info.name: _requantized(info.type_name, why) for info, t in (parts["ffn_gate_exps"],
                                                                                parts["ffn_up_exps"])
                     if t.action == KEEP}
        changes.update(converted)
        refused = [(name, t) for name, t in converted.items() if t.refused]
        notes += [GroupNote(name, f"tensor {name}: {t.reason}", refused=True) for name, t in refused]
        if not refused:
            notes.append(GroupNote(gate.name, f"tensors {gate.name} ({gate.type_name}) and {up.name} "
                                              f"({up.type_name}) differ in type; vLLM 0.23 keeps one type for the "
                                              f"fused w13 expert weight, so the loader re-quantizes both to "
                                              f"{REQUANTIZE_TYPE} (slower start, more memory)"))
    return changes, notes

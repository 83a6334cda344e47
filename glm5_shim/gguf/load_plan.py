"""What the loader does with each tensor of a glm-dsa GGUF, decided from headers only (no tensor data).

The actions and the rules that pick them are glm5_shim.gguf.type_policy's (the validator and `inspect` apply the
same rules); this module applies them to a file: `plan_tensors` records what no treatment can fix, `plan_load`
raises it.  One file serves two models: the target (draft=False: every trunk tensor, the MTP block skipped) and
vLLM's MTP draft (draft=True: the MTP block blk.{num_hidden_layers} only); `mtp_draft_problem` is the one line for a
file that cannot serve the draft.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import indexer_layout, mtp_block_absent
from .dequant import VLLM_UNQUANTIZED_TYPES
from .errors import GGUFError
from .reader import GGUFModel, TensorInfo
from .tensor_map import ROLE_MTP, ROLE_REBUILD_KV_B, ROLE_SHARED_INDEXER, TensorMap, TensorSpec, build_tensor_map, \
    known_unused_tensor
from .type_policy import SKIP, GroupNote, Treatment, loaded_type, row_problem, settle_groups, \
    skip_reason, treatment


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
        if self.hf_name is None:
            return None
        return loaded_type(self.action, self.info.type_name)


@dataclass(frozen=True)
class Refusal:
    """A tensor no treatment can serve: `message` is the one line plan_load raises."""

    info: TensorInfo
    spec: TensorSpec | None
    message: str


@dataclass
class LoadPlan:
    model: GGUFModel
    config: dict
    tensor_map: TensorMap
    tensors: list[PlannedTensor]
    notes: list[str] = field(default_factory=list)  # one line each: what the loader works around
    refused: list[Refusal] = field(default_factory=list)  # empty in a plan plan_load returns
    group_notes: list[GroupNote] = field(default_factory=list)  # type_policy.settle_groups's, as the validator says
    draft: bool = False  # the plan of vLLM's MTP draft (the MTP block only), not of the target model

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.config["tie_word_embeddings"])  # config.build_hf_config: no output.weight in the file

    def weight_types(self) -> dict[str, str]:
        """HF weight name → GGML type name as vLLM should see it (float for everything the loader makes float)."""
        return {t.hf_name: vllm_type for t in self.tensors if (vllm_type := t.vllm_type) is not None}

    def unquantized_modules(self) -> list[str]:
        """Module prefixes vLLM must build unquantized (what its GGUF loader derives from F32/F16/BF16 weights).  vLLM
        builds the MTP block's modules under their checkpoint names too (DeepSeekMultiTokenPredictorLayer hands its
        own prefix to the decoder layer), so these are HF names.  The draft's list also names each float fused
        module itself: DeepSeekMTP declares no packed_modules_mapping, so unless the target's mapping is already on
        the shared quant config, vLLM's is_layer_skipped_gguf matches a fused module by its own name."""
        modules = {name.removesuffix(".weight") for name, t in self.weight_types().items()
                   if t in VLLM_UNQUANTIZED_TYPES and name.endswith(".weight")}
        if self.draft:
            modules |= {t.spec.fused_group for t in self.tensors
                        if t.spec is not None and t.spec.fused_group and t.vllm_type in VLLM_UNQUANTIZED_TYPES}
        return sorted(modules)

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


# The flag that serves a file's MTP layer as vLLM's MTP draft (K = 1 drafts one token a step; vLLM reruns the one
# layer for larger K).
MTP_FLAG = """--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'"""
# What a user who asked for an MTP draft of a file without one can do instead.
MTP_ALTERNATIVES = ("serve it without --speculative-config (or with '{\"method\": \"ngram\", ...}'), or serve a GGUF "
                    "converted with its MTP layer (llama.cpp's convert_hf_to_gguf.py without --no-mtp)")


def mtp_draft_problem(model: GGUFModel, config: dict) -> str | None:
    """The one line for a file that cannot serve vLLM's MTP draft (--speculative-config method "mtp"): no MTP layer
    declared (llama.cpp's --no-mtp), declared but without its tensors (a trunk-only file), or a block the draft's
    plan refuses; None when the draft can load."""
    arch, path = model.architecture, model.path
    key = f"{arch}.nextn_predict_layers"
    n_mtp = config["num_nextn_predict_layers"]
    if not n_mtp:
        found = "0" if key in model.metadata else "absent, as llama.cpp's convert_hf_to_gguf.py --no-mtp writes"
        return (f"{path}: this GGUF has no multi-token-prediction (MTP) layer ({key} is {found}), so "
                f"--speculative-config method \"mtp\" has no draft to load; {MTP_ALTERNATIVES}")
    blocks = " ".join(f"blk.{layer}" for layer in range(config["num_hidden_layers"],
                                                          config["num_hidden_layers"] + n_mtp))
    if mtp_block_absent(model, config):
        return (f"{path}: {key} is {n_mtp} but the MTP layer {blocks} has no tensors in this file (a trunk-only "
                f"file), so --speculative-config method \"mtp\" has no draft to load; {MTP_ALTERNATIVES}")
    try:
        plan_load(model, config, draft=True)
    except GGUFError as exc:
        return f"{exc} (the MTP draft's layer {blocks}; without --speculative-config the model serves without it)"
    return None


def plan_load(model: GGUFModel, config: dict, *, draft: bool = False) -> LoadPlan:
    """Decide every tensor's treatment.  Raises GGUFError (one line) for what no treatment can fix.  draft: the plan
    of vLLM's MTP draft (the MTP block only), which also needs every required tensor of that block."""
    plan = plan_tensors(model, config, draft=draft)
    if plan.refused:
        raise GGUFError(plan.refused[0].message)
    if draft:
        _check_mtp_block_complete(plan)
    _check_kv_b_complete(plan)
    return plan


def plan_tensors(model: GGUFModel, config: dict, *, draft: bool = False) -> LoadPlan:
    """Every tensor's treatment, as plan_load decides it, but what no treatment can fix is listed in plan.refused
    (those tensors are not in plan.tensors) instead of raised."""
    tmap = build_tensor_map(config, include_mtp=True)
    planned: list[PlannedTensor] = []
    refused: list[Refusal] = []
    for info in model:
        spec = tmap.get(info.name)
        if spec is None:
            if known_unused_tensor(info.name) or draft:  # the target's plan refuses what is not glm-dsa
                planned.append(PlannedTensor(info, None, SKIP, None, "not used by GLM-5"))
            else:
                refused.append(Refusal(info, None, f"{info.path}: tensor {info.name} is not part of a glm-dsa model "
                                                   f"(expected only the tensors of llama.cpp's glm-dsa layout)"))
            continue
        outcome = _plan_one(info, spec, draft)
        (refused if isinstance(outcome, Refusal) else planned).append(outcome)
    plan = LoadPlan(model, config, tmap, planned, refused=refused, draft=draft)
    _settle_groups(plan)
    layer = config["num_hidden_layers"]
    if draft:
        loaded = [t for t in plan.tensors if t.action != SKIP]
        plan.notes.append(f"MTP draft: loading {len(loaded)} tensors of the multi-token-prediction block blk.{layer} "
                          "(embedding and lm_head shared with the target model)")
        return plan
    plan.notes.append("DSA indexer: " + indexer_layout(model, config["num_hidden_layers"]).describe())
    skipped = plan.by_action(SKIP)
    mtp_count = sum(1 for t in skipped if t.spec is not None and t.spec.role == ROLE_MTP)
    if mtp_count:
        plan.notes.append(f"skipping {mtp_count} tensors of the multi-token-prediction block blk.{layer} in the "
                          f"target model ({MTP_FLAG} loads them as vLLM's MTP draft)")
    unused = sorted({t.spec.layer for t in skipped if t.spec is not None and t.spec.role == ROLE_SHARED_INDEXER})
    if unused:
        plan.notes.append(f"ignoring the indexer tensors of {len(unused)} shared-indexer layer(s) "
                          f"({', '.join(map(str, unused))}): they reuse the previous full layer's top-k")
    return plan


def _plan_one(info: TensorInfo, spec: TensorSpec, draft: bool = False) -> PlannedTensor | Refusal:
    loc = f"{info.path}: tensor {info.name}"
    skip = skip_reason(spec, draft=draft)
    if skip is not None:
        return PlannedTensor(info, spec, SKIP, spec.hf_name, skip)
    if tuple(info.shape) != tuple(spec.shape):
        return Refusal(info, spec, f"{loc}: shape {list(info.shape)}, expected {list(spec.shape)} from the metadata")
    problem = row_problem(info)
    if problem is not None:
        return Refusal(info, spec, f"{loc}: {problem}")
    decided = treatment(spec, info)
    if decided.refused:
        return Refusal(info, spec, f"{loc}: {decided.reason}")
    return PlannedTensor(info, spec, decided.action, spec.hf_name, decided.reason)


def _settle_groups(plan: LoadPlan) -> None:
    """type_policy's rules across tensors (fused groups, gate/up experts), applied to the loaded tensors."""
    loaded = [t for t in plan.tensors if t.action != SKIP]
    changes, notes = settle_groups((t.spec, t.info, Treatment(t.action, t.why)) for t in loaded)
    by_name = {t.gguf_name: t for t in loaded}
    for name, decided in changes.items():
        if not decided.refused:
            by_name[name].action, by_name[name].why = decided.action, decided.reason
    plan.tensors = [t for t in plan.tensors if not changes.get(t.gguf_name, Treatment(t.action)).refused]
    plan.group_notes = notes
    for note in notes:
        if note.refused:
            t = by_name[note.tensor]
            plan.refused.append(Refusal(t.info, t.spec, f"{plan.model.path}: {note.message}"))
        else:
            plan.notes.append(note.message)


def _check_kv_b_complete(plan: LoadPlan) -> None:
    """kv_b_proj of every layer the plan loads (the trunk's, or the draft's MTP block) needs attn_k_b and attn_v_b,
    or a legacy attn_kv_b (TensorMap.missing)."""
    for spec in plan.tensor_map.missing(plan.model.tensors):
        if spec.base_role == ROLE_REBUILD_KV_B and spec.is_mtp == plan.draft:
            raise GGUFError(f"{plan.model.path}: tensor {spec.gguf_name} is missing "
                            "(expected attn_k_b and attn_v_b, or a legacy attn_kv_b, to rebuild kv_b_proj)")


def _check_mtp_block_complete(plan: LoadPlan) -> None:
    """The draft loads the whole MTP block: every required tensor of it must be in the file (the target's plan
    leaves missing tensors to the validator, which finds them before vLLM starts)."""
    for spec in plan.tensor_map.missing(plan.model.tensors):
        if spec.is_mtp and spec.base_role != ROLE_REBUILD_KV_B:
            raise GGUFError(f"{plan.model.path}: tensor {spec.gguf_name} of the MTP layer is missing (expected "
                            f"shape {list(spec.shape)}, loaded as {spec.param_name} of vLLM's MTP draft)")


def describe(plan: LoadPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in plan.tensors:
        counts[t.action] = counts.get(t.action, 0) + 1
    return counts

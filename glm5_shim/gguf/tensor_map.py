"""The explicit glm-dsa tensor table: GGUF name → the HF name vLLM's DeepseekV2Model.load_weights consumes.

Every entry carries the expected shape (numpy order, i.e. reversed GGUF ne) computed from the HF config,
and a role telling the loader how to treat it (which GGML types each role may have, and what the loader does with
each: glm5_shim.gguf.type_policy):

  normal         a linear weight, the embedding, a norm or the router: loaded as it is where vLLM can run it
  rebuild-kv_b   attn_k_b + attn_v_b (or a legacy attn_kv_b) → one float kv_b_proj weight
  force-float    vLLM builds these modules without quant_config: dequantize to float
  experts        3-D stacked routed experts, fed to vLLM as "expert 0" with the whole tensor
  mtp            belongs to the multi-token-prediction block (blk.{num_hidden_layers}): the target model skips it,
                 vLLM's MTP draft (deepseek_mtp.DeepSeekMTP, --speculative-config method "mtp") loads it, each tensor
                 treated as its base_role says
  from-target    (base role, MTP block only) nextn.embed_tokens / nextn.shared_head_head: vLLM's MTP proposer
                 replaces the draft's embedding and shared head with the target model's (llm_base_proposer.
                 _maybe_share_embeddings / _maybe_share_lm_head), so no loader loads them
  shared-indexer an indexer tensor of a layer that reuses the previous full layer's top-k (GLM-5.2's "shared"
                 layers, config indexer_types): not expected, ignored when present

No dummy HF model is built: the table is written out from the llama.cpp converter layout.  hf_name is the checkpoint
name vLLM's load_weights consumes, and also the prefix vLLM builds the module under (what its GGUF quant config
matches unquantized modules against); param_name is the parameter's name in vLLM's module tree: the same in the
trunk, while DeepSeekMTP keeps the MTP block's decoder under `mtp_block` (mtp_param_name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from .config import layer_shares_topk

ROLE_NORMAL = "normal"
ROLE_REBUILD_KV_B = "rebuild-kv_b"
ROLE_FORCE_FLOAT = "force-float"
ROLE_EXPERTS = "experts"
ROLE_MTP = "mtp"
ROLE_SHARED_INDEXER = "shared-indexer"
ROLE_FROM_TARGET = "from-target"

# How vLLM 0.23 splits a weight across tensor-parallel ranks: by output rows (column-parallel linears, vocab-parallel
# embedding and lm_head, gate/up experts), along each row's packed bytes (row-parallel: attn_output, the down
# projections; glm5_shim.gguf.tp_split checks those cut on whole blocks), or not at all (norms, the fused q_a/kv_a
# projection built with disable_tp, the DSA indexer, the router).
TP_COLUMN, TP_ROW, TP_REPLICATED = "column", "row", "replicated"
_ROT_EMBD_RE = re.compile(r"blk\.\d+\.attn_rot_embd(\.weight)?")


@dataclass(frozen=True)
class TensorSpec:
    """What one GGUF tensor is and where it goes."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]  # numpy order
    role: str
    layer: int | None = None  # block index, None for global tensors
    required: bool = True
    # What the tensor would be outside the MTP block (role is ROLE_MTP there).
    base_role: str = ROLE_NORMAL
    # llama.cpp never quantizes these (1-D tensors, norms, router, biases): they must be float (type_policy).
    float_only: bool = False
    # vLLM fuses these into one module, in one precision (type_policy.settle_groups).
    fused_group: str | None = None
    # The member's shard id in that module (vLLM's stacked_params_mapping): the order its output is concatenated in.
    fused_shard: int | None = None
    tp_split: str = TP_REPLICATED  # TP_COLUMN / TP_ROW / TP_REPLICATED
    # The parameter's name in vLLM's model when it differs from hf_name (the MTP block: mtp_param_name).
    vllm_name: str | None = None

    @property
    def is_mtp(self) -> bool:
        return self.role == ROLE_MTP

    @property
    def param_name(self) -> str:
        """The parameter's name in vLLM's model (named_parameters), before any fusing of shards or experts."""
        return self.vllm_name or self.hf_name


class TensorMap:
    """All GGUF tensors a glm-dsa model may contain, keyed by GGUF name."""

    def __init__(self, specs: Iterable[TensorSpec], config: dict[str, Any]):
        self.specs: dict[str, TensorSpec] = {s.gguf_name: s for s in specs}
        self.config = config

    def __contains__(self, gguf_name: str) -> bool:
        return gguf_name in self.specs

    def __getitem__(self, gguf_name: str) -> TensorSpec:
        return self.specs[gguf_name]

    def __iter__(self):
        return iter(self.specs.values())

    def __len__(self) -> int:
        return len(self.specs)

    def get(self, gguf_name: str) -> TensorSpec | None:
        return self.specs.get(gguf_name)

    def hf_name(self, gguf_name: str) -> str:
        return self.specs[gguf_name].hf_name

    def by_role(self, role: str) -> list[TensorSpec]:
        return [s for s in self.specs.values() if s.role == role]

    def gguf_to_hf(self, *, include_mtp: bool = False, roles: Iterable[str] | None = None) -> dict[str, str]:
        """GGUF name → HF name, e.g. for vLLM's `gguf_to_hf_name_map` (normal and experts roles by default)."""
        wanted = set(roles) if roles is not None else {ROLE_NORMAL, ROLE_EXPERTS}
        if include_mtp:
            wanted.add(ROLE_MTP)
        return {s.gguf_name: s.hf_name for s in self.specs.values() if s.role in wanted}

    def kv_b_sources(self, layer: int) -> dict[str, TensorSpec]:
        """The specs whose data make up kv_b_proj of `layer`: {'k_b','v_b','kv_b'} → spec."""
        prefix = f"blk.{layer}."
        return {
            part: self.specs[prefix + f"attn_{part}.weight"]
            for part in ("k_b", "v_b", "kv_b")
            if prefix + f"attn_{part}.weight" in self.specs
        }

    def missing(self, present: Iterable[str]) -> list[TensorSpec]:
        """Required specs absent from `present`, treating attn_kv_b as a stand-in for attn_k_b + attn_v_b."""
        present = set(present)
        out = []
        for spec in self.specs.values():
            if spec.gguf_name in present or not spec.required:
                continue
            if spec.base_role == ROLE_REBUILD_KV_B and spec.gguf_name.endswith(("attn_k_b.weight", "attn_v_b.weight")):
                legacy = f"blk.{spec.layer}.attn_kv_b.weight"
                if legacy in present:
                    continue
            out.append(spec)
        return out


# Checkpoint names of the MTP block that vLLM's DeepSeekMTP keeps outside its decoder block (mtp_block).
_MTP_OWN_NAMES = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head")


def mtp_param_name(hf_name: str, layer: int) -> str:
    """Where vLLM's DeepSeekMTP puts the MTP block's checkpoint weight `hf_name` (model.layers.{layer}.*): the
    decoder block's weights move under model.layers.{layer}.mtp_block., embed_tokens to the top (model.embed_tokens),
    enorm / hnorm / eh_proj / shared_head stay.  The rule of DeepSeekMTP._rewrite_spec_layer_name in vLLM 0.23
    (tests/test_gguf_mtp_load.py checks this function against vLLM's on every tensor of the table)."""
    prefix = f"model.layers.{layer}."
    own = next((n for n in _MTP_OWN_NAMES if n in hf_name), None)
    if own is None:
        return hf_name.replace(prefix, prefix + "mtp_block.")
    if own == "embed_tokens":
        return hf_name.replace(prefix, "model.")
    return hf_name


def build_tensor_map(config: dict[str, Any], *, include_mtp: bool = True) -> TensorMap:
    """Every GGUF tensor of a glm-dsa model described by `config` (an HF glm_moe_dsa config dict)."""
    c = config
    hidden = c["hidden_size"]
    vocab = c["vocab_size"]
    heads = c["num_attention_heads"]
    nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c["q_lora_rank"], c["kv_lora_rank"]
    index_heads, index_dim = c["index_n_heads"], c["index_head_dim"]
    experts, moe_inter = c["n_routed_experts"], c["moe_intermediate_size"]
    shared_inter = moe_inter * c["n_shared_experts"]
    n_layers = c["num_hidden_layers"]
    n_mtp = c.get("num_nextn_predict_layers", 0) if include_mtp else 0

    specs: list[TensorSpec] = [
        TensorSpec("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden), ROLE_NORMAL, tp_split=TP_COLUMN),
        TensorSpec("output_norm.weight", "model.norm.weight", (hidden,), ROLE_NORMAL, float_only=True),
        # Absent output.weight means tied embeddings: the loader reuses token_embd.
        TensorSpec("output.weight", "lm_head.weight", (vocab, hidden), ROLE_NORMAL, required=False, tp_split=TP_COLUMN),
    ]
    for layer in range(n_layers + n_mtp):
        is_mtp = layer >= n_layers
        is_moe = layer >= c["first_k_dense_replace"] and layer % c.get("moe_layer_freq", 1) == 0
        blk = f"blk.{layer}."
        hf = f"model.layers.{layer}."

        def add(gguf_suffix: str, hf_suffix: str, shape: tuple[int, ...], role: str = ROLE_NORMAL, *,
                required: bool = True, float_only: bool = False, fused: tuple[str, int] | None = None,
                tp: str = TP_REPLICATED) -> None:
            specs.append(TensorSpec(
                gguf_name=blk + gguf_suffix,
                hf_name=hf + hf_suffix,
                shape=tuple(shape),
                role=ROLE_MTP if is_mtp else role,
                layer=layer,
                required=required,
                base_role=role,
                float_only=float_only,
                fused_group=(hf + fused[0]) if fused else None,
                fused_shard=fused[1] if fused else None,
                tp_split=tp,
                vllm_name=mtp_param_name(hf + hf_suffix, layer) if is_mtp else None,
            ))

        add("attn_norm.weight", "input_layernorm.weight", (hidden,), float_only=True)
        add("ffn_norm.weight", "post_attention_layernorm.weight", (hidden,), float_only=True)
        add("attn_q_a.weight", "self_attn.q_a_proj.weight", (q_lora, hidden), fused=("self_attn.fused_qkv_a_proj", 0))
        add("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", (q_lora,), float_only=True)
        add("attn_q_b.weight", "self_attn.q_b_proj.weight", (heads * (nope + rope), q_lora), tp=TP_COLUMN)
        add("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", (kv_lora + rope, hidden),
            fused=("self_attn.fused_qkv_a_proj", 1))
        add("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", (kv_lora,), float_only=True)
        # The converter splits kv_b_proj per head into k_b (transposed) and v_b; the loader rebuilds it.
        add("attn_k_b.weight", "self_attn.kv_b_proj.weight", (heads, kv_lora, nope), ROLE_REBUILD_KV_B, tp=TP_COLUMN)
        add("attn_v_b.weight", "self_attn.kv_b_proj.weight", (heads, v_dim, kv_lora), ROLE_REBUILD_KV_B, tp=TP_COLUMN)
        add("attn_kv_b.weight", "self_attn.kv_b_proj.weight", (heads * (nope + v_dim), kv_lora), ROLE_REBUILD_KV_B,
            required=False, tp=TP_COLUMN)
        add("attn_output.weight", "self_attn.o_proj.weight", (hidden, heads * v_dim), tp=TP_ROW)
        if layer_shares_topk(c, layer):
            for suffix, hf_suffix, shape in (
                    ("attn_q_b.weight", "wq_b.weight", (index_heads * index_dim, q_lora)),
                    ("attn_k.weight", "wk.weight", (index_dim, hidden)),
                    ("proj.weight", "weights_proj.weight", (index_heads, hidden)),
                    ("k_norm.weight", "k_norm.weight", (index_dim,)),
                    ("k_norm.bias", "k_norm.bias", (index_dim,))):
                add("indexer." + suffix, "self_attn.indexer." + hf_suffix, shape, ROLE_SHARED_INDEXER, required=False)
        else:
            add("indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight", (index_heads * index_dim, q_lora))
            # vLLM fuses wk + weights_proj into an unquantized module (quant_config=None).
            add("indexer.attn_k.weight", "self_attn.indexer.wk.weight", (index_dim, hidden), ROLE_FORCE_FLOAT)
            add("indexer.proj.weight", "self_attn.indexer.weights_proj.weight", (index_heads, hidden),
                ROLE_FORCE_FLOAT)
            add("indexer.k_norm.weight", "self_attn.indexer.k_norm.weight", (index_dim,), float_only=True)
            add("indexer.k_norm.bias", "self_attn.indexer.k_norm.bias", (index_dim,), float_only=True)
        if is_moe:
            add("ffn_gate_inp.weight", "mlp.gate.weight", (experts, hidden), float_only=True)
            add("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", (experts,), float_only=True)
            add("ffn_gate_exps.weight", "mlp.experts.0.gate_proj.weight", (experts, moe_inter, hidden), ROLE_EXPERTS,
                tp=TP_COLUMN)
            add("ffn_up_exps.weight", "mlp.experts.0.up_proj.weight", (experts, moe_inter, hidden), ROLE_EXPERTS,
                tp=TP_COLUMN)
            add("ffn_down_exps.weight", "mlp.experts.0.down_proj.weight", (experts, hidden, moe_inter), ROLE_EXPERTS,
                tp=TP_ROW)
            if shared_inter:
                add("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", (shared_inter, hidden),
                    fused=("mlp.shared_experts.gate_up_proj", 0), tp=TP_COLUMN)
                add("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", (shared_inter, hidden),
                    fused=("mlp.shared_experts.gate_up_proj", 1), tp=TP_COLUMN)
                add("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", (hidden, shared_inter), tp=TP_ROW)
        else:
            inter = c["intermediate_size"]
            add("ffn_gate.weight", "mlp.gate_proj.weight", (inter, hidden), fused=("mlp.gate_up_proj", 0), tp=TP_COLUMN)
            add("ffn_up.weight", "mlp.up_proj.weight", (inter, hidden), fused=("mlp.gate_up_proj", 1), tp=TP_COLUMN)
            add("ffn_down.weight", "mlp.down_proj.weight", (hidden, inter), tp=TP_ROW)
        if is_mtp:
            # vLLM's DeepSeekMultiTokenPredictorLayer builds eh_proj as a plain torch Linear (no quant_config).
            add("nextn.eh_proj.weight", "eh_proj.weight", (hidden, 2 * hidden), ROLE_FORCE_FLOAT)
            add("nextn.enorm.weight", "enorm.weight", (hidden,), float_only=True)
            add("nextn.hnorm.weight", "hnorm.weight", (hidden,), float_only=True)
            add("nextn.shared_head_norm.weight", "shared_head.norm.weight", (hidden,), float_only=True)
            # Optional in llama.cpp (absent: the block shares token_embd / output); vLLM's proposer uses the target's.
            add("nextn.embed_tokens.weight", "embed_tokens.weight", (vocab, hidden), ROLE_FROM_TARGET,
                required=False)
            add("nextn.shared_head_head.weight", "shared_head.head.weight", (vocab, hidden), ROLE_FROM_TARGET,
                required=False)
    return TensorMap(specs, config)


def known_unused_tensor(gguf_name: str) -> bool:
    """Tensors gguf's GLM_DSA table allows but GLM-5 does not use (the loader can ignore them)."""
    return gguf_name == "rope_freqs.weight" or _ROT_EMBD_RE.fullmatch(gguf_name) is not None

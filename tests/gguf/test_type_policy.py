"""One type policy (glm5_shim.gguf.type_policy), three consumers that must agree on it.

For one tensor of each role of the tensor table and every GGML type gguf-py knows, a stand-in of a small file in
which only that tensor has that type (headers only: none of the consumers reads tensor data) goes through the
validator, the load plan and `inspect`:

  * the validator has an error exactly when plan_load raises, and the plan's line is one of the validator's;
    inspect then counts a refused tensor and its TP check carries the same line;
  * every tensor the plan hands vLLM as another type than the file's (outside the roles that are made float by
    design: kv_b, the indexer's wk / weights_proj) is named by a validator warning, and every new warning names
    such a tensor;
  * inspect's per-action counts are the plan's, and its TP1 weight memory is what the plan hands vLLM: bf16 for what
    vLLM gets as float, the GGUF size of the type it gets otherwise, nothing for what the loader skips;
  * the MTP block and a shared-indexer layer are skipped whatever their type (the validator at most warns, unless
    the rows are not whole blocks: a malformed file).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import gguf
import pytest

from glm5_shim import report as gguf_inspect
from glm5_shim.gguf.config import build_hf_config
from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.load_plan import plan_load
from glm5_shim.gguf.reader import GGUFModel, open_gguf
from glm5_shim.gguf.tensor_map import ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_NORMAL, ROLE_REBUILD_KV_B, \
    build_tensor_map
from glm5_shim.gguf.type_policy import DEQUANTIZE, FLOAT, KEEP, KV_B, REQUANTIZE, SKIP, treatment
from glm5_shim.gguf.validate import ERROR, WARNING, validate_model

ALL_TYPES = [t.name for t in gguf.GGMLQuantizationType]
FLOAT_NAMES = ("F32", "F16", "BF16")

# One tensor per role of the table in a 2-layer file (block 0 dense, block 1 MoE, block 2 the MTP block); the
# fused and gate/up members have a Q8_0 partner, so the cross-tensor rules are exercised too.
LOADED = [
    "blk.1.attn_norm.weight",  # normal, float_only
    "blk.1.attn_q_b.weight",  # normal linear, column-parallel
    "blk.0.ffn_down.weight",  # normal linear, row-parallel
    "blk.1.attn_q_a.weight",  # normal, fused with attn_kv_a_mqa
    "blk.0.ffn_up.weight",  # normal, fused with ffn_gate
    "token_embd.weight",  # the embedding (also lm_head's source when tied)
    "blk.1.ffn_gate_exps.weight",  # routed experts, one type with ffn_up_exps
    "blk.1.ffn_down_exps.weight",  # routed experts
    "blk.0.indexer.attn_k.weight",  # force-float
    "blk.1.indexer.proj.weight",  # force-float (F32 in the file)
    "blk.1.attn_k_b.weight",  # rebuild-kv_b (rows of 192 values)
]
MTP = ["blk.2.attn_q_b.weight", "blk.2.ffn_down_exps.weight", "blk.2.attn_norm.weight"]


def _retyped(model: GGUFModel, name: str, type_name: str) -> GGUFModel:
    """The model with tensor `name` claiming `type_name` (shape kept, byte size that of the type)."""
    info = model.tensors[name]
    qtype = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(info.reader_tensor.n_elements)
    stand_in = SimpleNamespace(name=name, tensor_type=qtype, shape=info.reader_tensor.shape, n_elements=n,
                               n_bytes=n * size // block, data=None)
    tensors = {**model.tensors, name: replace(info, reader_tensor=stand_in)}
    return GGUFModel(model.paths, model.readers, model.metadata, tensors)


def _gpu_bytes(vllm_type: str | None, n_elements: int) -> int:
    if vllm_type is None:
        return 0
    if vllm_type in FLOAT_NAMES:
        return 2 * n_elements  # bfloat16 on the GPU
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[vllm_type]]
    return n_elements // block * size


class Consumers:
    """What the validator, the load plan and inspect make of one model."""

    def __init__(self, model: GGUFModel):
        self.model = model
        self.findings = validate_model(model)
        try:
            self.plan, self.raised = plan_load(model, build_hf_config(model)), None
        except GGUFError as exc:
            self.plan, self.raised = None, str(exc)
        self.report = gguf_inspect.inspect_model(model)

    def level(self, level: str) -> list[str]:
        return [f.message for f in self.findings if f.level == level]


@pytest.fixture(scope="module")
def base(small):
    model = open_gguf(small("type-policy").path)
    consumers = Consumers(model)
    assert consumers.findings == [] and consumers.raised is None
    assert {t.info.type_name for t in consumers.plan.tensors} == {"Q8_0", "F32"}
    return consumers


def _check_agreement(case: Consumers, base: Consumers, name: str, type_name: str) -> None:
    what = f"{name} as {type_name}"
    errors, warnings = case.level(ERROR), case.level(WARNING)
    new_warnings = [w for w in warnings if w not in base.level(WARNING)]
    for message in errors + warnings:
        assert "\n" not in message and str(case.model.path) in message, (what, message)

    # refusals: the validator errs exactly when the plan raises, on the same line; inspect counts a refusal
    assert bool(errors) == (case.raised is not None), (what, errors, case.raised)
    assert ("refused" in case.report["load_actions"]) == (case.raised is not None), (what, case.report)
    if case.raised is not None:
        assert case.raised in errors and name in case.raised, (what, case.raised, errors)
        assert case.report["tp_split"] == {"error": case.raised}
        return

    # workarounds: what vLLM gets as another type is warned about, and each new warning names such a tensor
    by_design = (ROLE_REBUILD_KV_B, ROLE_FORCE_FLOAT)
    converted = {t.gguf_name for t in case.plan.tensors
                 if t.vllm_type not in (None, t.info.type_name) and t.spec.base_role not in by_design}
    for tensor in converted:
        assert any(tensor in w for w in new_warnings), (what, tensor, "converted without a warning", new_warnings)
    for warning in new_warnings:
        assert any(tensor in warning for tensor in converted), (what, warning, "warned, nothing converted")

    # inspect: the plan's actions, and the weight memory of what the plan hands vLLM
    assert case.report["load_actions"] == dict(Counter(t.action for t in case.plan.tensors)), what
    expected = sum(_gpu_bytes(t.vllm_type, t.info.n_elements) for t in case.plan.tensors)
    assert case.report["weight_bytes_per_gpu"]["1"] == expected, what


@pytest.mark.parametrize("name", LOADED)
def test_validator_plan_and_inspect_agree_for_every_type(base, name):
    outcomes = Counter()
    for type_name in ALL_TYPES:
        case = Consumers(_retyped(base.model, name, type_name))
        _check_agreement(case, base, name, type_name)
        planned = {t.gguf_name: t for t in case.plan.tensors} if case.plan else {}
        outcomes[planned[name].action if name in planned else "refused"] += 1
    # every role both accepts and refuses some types (the loop above saw both branches)
    assert outcomes["refused"] and sum(outcomes.values()) - outcomes["refused"], outcomes


@pytest.mark.parametrize("name", MTP)
def test_the_mtp_block_is_skipped_whatever_its_type(base, name):
    for type_name in ALL_TYPES:
        case = Consumers(_retyped(base.model, name, type_name))
        assert case.raised is None, (name, type_name, case.raised)
        assert {t.gguf_name: t.action for t in case.plan.tensors}[name] == SKIP
        assert case.report["weight_bytes_per_gpu"] == base.report["weight_bytes_per_gpu"], (name, type_name)
        # problems confined to the skipped block are warnings, unless the file itself is malformed
        assert all("block size" in e for e in case.level(ERROR)), (name, type_name, case.level(ERROR))


def test_a_shared_indexer_layer_is_skipped_whatever_its_type(small):
    model = open_gguf(small("type-policy-shared", indexer_types="FS", shared_indexer_weights=True).path)
    base = Consumers(model)
    assert base.raised is None and not base.level(ERROR)
    name = "blk.1.indexer.attn_k.weight"
    assert {t.gguf_name: t.action for t in base.plan.tensors}[name] == SKIP
    for type_name in ALL_TYPES:
        case = Consumers(_retyped(model, name, type_name))
        assert case.raised is None and case.findings == base.findings, (type_name, case.findings)
        assert case.report["weight_bytes_per_gpu"] == base.report["weight_bytes_per_gpu"], type_name


def test_the_policy_on_each_role():
    """The policy itself, one line per role: what each class of type becomes (None: refused)."""
    from glm5_shim.gguf.fixture import tiny_hf_config, tiny_tokenizer

    table = build_tensor_map(tiny_hf_config(layers=2, heads=4, index_heads=4, index_topk=128, mtp=True,
                                            tokenizer=tiny_tokenizer()))
    # float; vLLM runs it; vLLM runs it, gguf cannot dequantize it; gguf dequantizes it, vLLM cannot run it; neither
    types = ("F16", "Q8_0", "Q8_1", "TQ1_0", "I8")
    expected = {
        "blk.1.attn_norm.weight": (FLOAT, None, None, None, None),
        "blk.1.attn_q_b.weight": (FLOAT, KEEP, KEEP, DEQUANTIZE, None),
        "blk.1.ffn_down_exps.weight": (REQUANTIZE, KEEP, KEEP, None, None),
        "blk.0.indexer.attn_k.weight": (FLOAT, DEQUANTIZE, None, DEQUANTIZE, None),
        "blk.1.attn_k_b.weight": (KV_B, KV_B, None, KV_B, None),
        "blk.2.attn_q_b.weight": (FLOAT, KEEP, KEEP, DEQUANTIZE, None),  # as outside the MTP block
    }
    assert {table[n].base_role for n in expected} == {ROLE_NORMAL, ROLE_EXPERTS, ROLE_FORCE_FLOAT, ROLE_REBUILD_KV_B}
    for name, actions in expected.items():
        spec = table[name]
        got = tuple(treatment(spec, SimpleNamespace(type_name=t, shape=spec.shape, n_elements=1)).action
                    for t in types)
        assert got == actions, (name, got)

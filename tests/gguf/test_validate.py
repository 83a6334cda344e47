"""The validator: clean files pass, each kind of bad input is reported on one line naming file and tensor/key."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from glm5_shim.gguf.errors import GGUFError
from glm5_shim.gguf.validate import ERROR, WARNING, check, validate
from tests.helpers import write_other_architecture_gguf


def _errors(findings):
    return [f for f in findings if f.level == ERROR]


def _assert_reported(findings, level: str, *fragments: str):
    """Exactly the findings of `level` that mention every fragment; at least one; all one-line."""
    for finding in findings:
        assert "\n" not in finding.message and finding.level in (ERROR, WARNING)
    hits = [f for f in findings if f.level == level and all(fr in f.message for fr in fragments)]
    assert hits, (level, fragments, [str(f) for f in findings])
    return hits


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K", "Q6_K", "Q5_0"])
def test_good_files_have_no_findings(tiny_by_quant, quant):
    path = tiny_by_quant(quant).path
    assert validate(path) == []
    assert check(path) == []


def test_sharded_good_file(small):
    assert validate(small("split3", shards=3).path) == []


def test_float_experts_are_a_loader_warning(tiny_by_quant):
    findings = validate(tiny_by_quant("F16").path)
    assert findings and not _errors(findings)
    # 2 MoE blocks + the MTP block, 3 expert tensors each.
    assert len(findings) == 9
    assert all("routed experts are F16" in f.message for f in findings)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    findings = validate(path)
    assert len(findings) == 1
    _assert_reported(findings, ERROR, str(path), "not a GGUF")
    with pytest.raises(GGUFError, match="not a GGUF"):
        check(path)


def test_other_architecture(tmp_path):
    path = tmp_path / "qwen.gguf"
    write_other_architecture_gguf(path)
    _assert_reported(validate(path), ERROR, str(path), "general.architecture", "qwen2")


def test_truncated(small, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(small("good").path.read_bytes()[:-4096])
    _assert_reported(validate(path), ERROR, str(path), "truncated", "tensor blk.")


def test_missing_shard(small, tmp_path):
    split = small("split3", shards=3)
    for p in split.paths[:2]:
        shutil.copy(p, tmp_path / p.name)
    _assert_reported(validate(tmp_path / split.paths[0].name), ERROR, "missing shard 3 of 3",
                     str(tmp_path / split.paths[2].name))


def test_wrong_tensor_shape(small):
    def shrink(name, array):
        return array[:, :, :128] if name == "blk.1.ffn_down_exps.weight" else array
    bad = small("shape", tensor_hook=shrink)
    hits = _assert_reported(validate(bad.path), ERROR, str(bad.path), "blk.1.ffn_down_exps.weight",
                            "expected shape [8, 256, 256]", "found [8, 256, 128]")
    assert hits[0].tensor == "blk.1.ffn_down_exps.weight"
    with pytest.raises(GGUFError, match="blk.1.ffn_down_exps.weight"):
        check(bad.path)


def test_metadata_contradicting_tensor_shapes(small):
    bad = small("meta-qlora", metadata_overrides={"glm-dsa.attention.q_lora_rank": 128})
    findings = validate(bad.path)
    _assert_reported(findings, ERROR, str(bad.path), "glm-dsa.attention.q_lora_rank", "blk.0.attn_q_a.weight")
    with pytest.raises(GGUFError, match="glm-dsa.attention.q_lora_rank = 128 contradicts tensor blk.0.attn_q_a"):
        check(bad.path)


@pytest.mark.parametrize("tensor, qtype", [
    ("blk.1.ffn_down_exps.weight", "MXFP4"),
    ("blk.1.ffn_gate_exps.weight", "TQ1_0"),
])
def test_unsupported_quant_type_on_kept_quantized_tensor(small, tensor, qtype):
    # Routed experts must stay quantized in vLLM 0.23: a type it cannot run there is an error.
    bad = small(f"unsupported-{qtype}", overrides={tensor: qtype})
    hits = _assert_reported(validate(bad.path), ERROR, str(bad.path), tensor, f"type {qtype} is not supported")
    assert len(_errors(validate(bad.path))) == len(hits) == 1


@pytest.mark.parametrize("tensor, qtype", [
    ("blk.1.attn_q_b.weight", "TQ1_0"),
    ("token_embd.weight", "TQ2_0"),
])
def test_unsupported_quant_type_on_linear_is_dequantized(small, tensor, qtype):
    # A linear weight of a type vLLM has no kernel for is made float by the loader: a warning with its cost.
    odd = small(f"dequant-{qtype}", overrides={tensor: qtype})
    findings = validate(odd.path)
    assert not _errors(findings)
    _assert_reported(findings, WARNING, tensor, f"type {qtype} has no vLLM 0.23 kernel", "MiB")


def test_force_dequantized_tensors_accept_any_dequantizable_type(small):
    ok = small("mxfp4-indexer", overrides={"blk.0.indexer.attn_k.weight": "MXFP4",
                                           "blk.1.indexer.proj.weight": "TQ2_0",
                                           "blk.1.attn_v_b.weight": "MXFP4"})
    assert validate(ok.path) == []


def test_quantized_norm_is_an_error(small):
    bad = small("q-norm", overrides={"blk.1.attn_norm.weight": "Q8_0"})
    _assert_reported(validate(bad.path), ERROR, "blk.1.attn_norm.weight", "type Q8_0 is not allowed")


def test_gate_up_expert_types_differ(small):
    odd = small("gate-up", overrides={"blk.1.ffn_up_exps.weight": "Q4_0"})
    findings = validate(odd.path)
    assert not _errors(findings)
    _assert_reported(findings, WARNING, "blk.1.ffn_gate_exps.weight (Q8_0)", "blk.1.ffn_up_exps.weight (Q4_0)")


@pytest.mark.parametrize("tensor, partner", [
    ("blk.1.attn_kv_a_mqa.weight", "blk.1.attn_q_a.weight"),
    ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"),
    ("blk.1.ffn_gate_shexp.weight", "blk.1.ffn_up_shexp.weight"),
])
def test_fused_group_mixing_float_and_quantized(small, tensor, partner):
    odd = small(f"fused-{tensor}", overrides={tensor: "BF16"})
    findings = validate(odd.path)
    assert not _errors(findings)
    _assert_reported(findings, WARNING, f"{tensor}=BF16", f"{partner}=Q8_0", "fused")


def test_missing_tensor(small):
    bad = small("missing", tensor_hook=lambda name, a: None if name == "blk.1.attn_q_b.weight" else a)
    _assert_reported(validate(bad.path), ERROR, str(bad.path), "tensor blk.1.attn_q_b.weight is missing")


def test_missing_kv_b_parts_but_legacy_kv_b_present(small):
    kv_b = np.zeros((4 * 448, 512), dtype=np.float32)
    legacy = small("legacy-kvb", tensor_hook=lambda name, a: None if name.startswith("blk.0.attn_") and
                   name.endswith(("_k_b.weight", "_v_b.weight")) else a,
                   extra_tensors={"blk.0.attn_kv_b.weight": kv_b})
    assert validate(legacy.path) == []


def test_unexpected_tensors(small):
    odd = small("extra", extra_tensors={"blk.0.ffn_gate_up_exps.weight": np.zeros((2, 64), np.float32),
                                        "rope_freqs.weight": np.ones(32, np.float32)})
    findings = validate(odd.path)
    _assert_reported(findings, ERROR, "tensor blk.0.ffn_gate_up_exps.weight is unexpected")
    _assert_reported(findings, WARNING, "tensor rope_freqs.weight is not used")


def test_mtp_problems_do_not_block_serving(small):
    odd = small("mtp-broken", tensor_hook=lambda name, a: None if name == "blk.2.nextn.eh_proj.weight" else a,
                overrides={"blk.2.attn_q_b.weight": "TQ1_0"})
    findings = validate(odd.path)
    assert not _errors(findings)
    _assert_reported(findings, WARNING, "blk.2.nextn.eh_proj.weight is missing")
    _assert_reported(findings, WARNING, "blk.2.attn_q_b.weight", "TQ1_0")


# --- split MTP files (llama.cpp's convert_hf_to_gguf.py --no-mtp / --mtp) -------------------------------------------

def test_trunk_only_file_validates(small):
    """--no-mtp: block_count = num_hidden_layers, no nextn_predict_layers key, no MTP block: a plain model."""
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.reader import open_gguf

    trunk = small("split-trunk", split_mtp="trunk")
    model = open_gguf(trunk.path)
    assert model.metadata["glm-dsa.block_count"] == 2 and "glm-dsa.nextn_predict_layers" not in model.metadata
    assert not [n for n in model.tensors if n.startswith("blk.2.")]
    assert validate(trunk.path) == []
    config = build_hf_config(model)
    assert config["num_hidden_layers"] == 2 and config["num_nextn_predict_layers"] == 0


def test_declared_mtp_block_without_tensors_is_one_warning(small):
    """nextn_predict_layers 1 but no blk.2.* (llama.cpp: "trunk-only", no blk.{n_layer}.nextn.eh_proj.weight): the
    loader skips the MTP block anyway, so one warning, not one per MTP tensor, and no block_count error."""
    from glm5_shim.gguf.config import build_hf_config
    from glm5_shim.gguf.reader import open_gguf

    stripped = small("split-stripped", split_mtp="stripped")
    model = open_gguf(stripped.path)
    assert model.metadata["glm-dsa.block_count"] == 3 and model.metadata["glm-dsa.nextn_predict_layers"] == 1
    assert not [n for n in model.tensors if n.startswith("blk.2.")]
    findings = validate(stripped.path)
    assert len(findings) == 1
    _assert_reported(findings, WARNING, str(stripped.path), "glm-dsa.nextn_predict_layers is 1",
                     "multi-token-prediction block blk.2 has no tensors")
    assert check(stripped.path) == findings
    config = build_hf_config(model)  # the shape checks the config hook runs pass too
    assert config["num_hidden_layers"] == 2 and config["num_nextn_predict_layers"] == 1


def test_partly_missing_mtp_block_is_still_reported_tensor_by_tensor(small):
    odd = small("mtp-half", tensor_hook=lambda name, a: None if name.startswith("blk.2.") and "ffn" in name else a)
    findings = validate(odd.path)
    assert not _errors(findings) and len(findings) > 1
    _assert_reported(findings, WARNING, "blk.2.ffn_up_exps.weight is missing")


def test_truncated_trunk_with_stripped_mtp_block_is_an_error(small):
    cut = small("split-stripped-cut", split_mtp="stripped",
                tensor_hook=lambda name, a: None if name.startswith("blk.1.") else a)
    findings = validate(cut.path)
    _assert_reported(findings, ERROR, "glm-dsa.block_count = 3 contradicts the tensors: blk.2.attn_norm.weight")
    _assert_reported(findings, ERROR, "tensor blk.1.attn_q_b.weight is missing")


def test_mtp_only_file_is_one_error(small):
    """--mtp: the MTP block and the embeddings only: one line that says what the file is, before anything else."""
    from glm5_shim.loading.hf_config import config_dict_from_gguf
    from glm5_shim.gguf.reader import open_gguf
    from glm5_shim.preflight import problem

    draft = small("split-mtp", split_mtp="mtp")
    model = open_gguf(draft.path)
    assert sorted({n.split(".")[1] for n in model.tensors if n.startswith("blk.")}) == ["2"]
    assert "blk.0.attn_norm.weight" not in model.tensors and model.metadata["glm-dsa.nextn_predict_layers"] == 1
    message = (f"{draft.path}: this is an MTP-only GGUF (llama.cpp convert --mtp: only the nextn block blk.2 and the "
               f"embeddings); serve the main model file, MTP drafts come from a file that holds its MTP layer with "
               f"the trunk (--speculative-config method mtp), not from a separate --mtp file")
    findings = validate(draft.path)
    assert [(f.level, f.message) for f in findings] == [(ERROR, message)]
    with pytest.raises(GGUFError) as exc_info:
        check(draft.path)
    assert str(exc_info.value) == message
    assert problem(str(draft.path)) == message  # launch.sh's line
    with pytest.raises(GGUFError) as exc_info:
        config_dict_from_gguf(draft.path)  # what vLLM's get_config raises through the shim
    assert str(exc_info.value) == message


def test_mtp_only_split_file_names_its_first_shard(small):
    draft = small("split-mtp-shards", split_mtp="mtp", shards=2)
    findings = validate(draft.path)
    assert [f.level for f in findings] == [ERROR] and findings[0].message.startswith(f"{draft.path}: this is an "
                                                                                     f"MTP-only GGUF")


def test_main_model_without_trunk_tensors_but_no_mtp_block_is_not_called_mtp_only(small):
    empty = small("no-blocks", tensor_hook=lambda name, a: None if name.startswith("blk.") else a)
    findings = validate(empty.path)
    assert len(_errors(findings)) > 1 and not [f for f in findings if "MTP-only" in f.message]

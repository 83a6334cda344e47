"""The float32 reference of the trunk's and the MTP layer's logits (glm5_shim.gguf.fixture.reference_model), and
make-tiny's MTP layer that drafts the peaked model's next token (PEAKED_MTP).

The reference is checked against transformers' own GlmMoeDsa implementation (transformers >= 5.2:
CI's main step; skipped on 4.x): the trunk's logits, and the MTP layer's, whose decoder block, final norm and
head are a one-layer GlmMoeDsaForCausalLM holding the MTP block's weights (shared_head.norm as its norm, the
target's lm_head) fed the eh_proj output computed here in torch.  Its wiring around the block is checked against
vLLM's own DeepSeekMTP layer in tests/test_gguf_mtp_load.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from glm5_shim.gguf.fixture import PEAKED, PEAKED_MTP, ReferenceModel, greedy_with_mtp_acceptance, make_tiny, \
    mtp_reference_logits, reference_dir


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """The same tiny Q4_K model twice (reference = what the GGUF stores): plain peaked, and with the MTP layer."""
    root = tmp_path_factory.mktemp("mtp-reference")
    return {name: ReferenceModel.from_reference_dir(reference_dir(
        make_tiny(root / f"{name}.gguf", quant="Q4_K", layers=2, reference="dequantized", **kwargs)[0]))
        for name, kwargs in (("peaked", PEAKED), ("peaked-mtp", PEAKED_MTP))}


def test_the_mtp_layer_drafts_the_peaked_models_next_token(peaked):
    """Greedy decoding of the float32 trunk, with the MTP layer's draft one step ahead: PEAKED_MTP's is what the
    trunk then says (the construction in weights._mtp_follows_bigram), the plain peaked model's random layer is
    not; both prompts above and below index_topk (128)."""
    for prompt in (list(range(20, 60)), list(range(300, 500))):
        good = greedy_with_mtp_acceptance(peaked["peaked-mtp"], prompt, 16)
        plain = greedy_with_mtp_acceptance(peaked["peaked"], prompt, 16)
        assert good["ids"] == plain["ids"]  # the trunk is the same model
        assert len(good["accepted"]) == 15 and good["acceptance"] >= 0.9, good
        assert plain["acceptance"] <= 0.2, plain


def test_only_eh_proj_differs(tmp_path):
    """PEAKED_MTP changes the MTP layer's eh_proj and nothing else (the GGUF's other tensors are PEAKED's)."""
    a = make_tiny(tmp_path / "a.gguf", quant="F32", layers=2, **PEAKED)[0]
    b = make_tiny(tmp_path / "b.gguf", quant="F32", layers=2, **PEAKED_MTP)[0]
    from safetensors.numpy import load_file

    wa, wb = (load_file(str(reference_dir(path) / "model.safetensors")) for path in (a, b))
    assert [n for n in wa if not np.array_equal(wa[n], wb[n])] == ["model.layers.2.eh_proj.weight"]
    eh = wb["model.layers.2.eh_proj.weight"]
    assert np.array_equal(eh[:, :256], np.eye(256, dtype=np.float32))
    assert np.allclose(eh[:, 256:], 0.05 * wa["model.layers.2.eh_proj.weight"][:, 256:])
    with pytest.raises(ValueError, match="bigram"):
        make_tiny(tmp_path / "c.gguf", layers=2, mtp_follows_bigram=True)
    with pytest.raises(ValueError, match="MTP layer"):
        make_tiny(tmp_path / "d.gguf", layers=2, mtp=False, **PEAKED_MTP)


def test_the_command_line_option(tmp_path):
    from glm5_shim.gguf.fixture import main

    assert main(["make-tiny", str(tmp_path / "m.gguf"), "--layers", "2", "--quant", "F32", "--peaked-mtp"]) == 0
    model = ReferenceModel.from_reference_dir(reference_dir(tmp_path / "m.gguf"))
    assert np.array_equal(model.weights["model.layers.2.eh_proj.weight"][:, :256], np.eye(256, dtype=np.float32))


def test_mtp_reference_logits_shapes_and_inputs(peaked):
    ids = list(range(20, 40))
    out = mtp_reference_logits(peaked["peaked-mtp"], ids)
    vocab = peaked["peaked-mtp"].config["vocab_size"]
    assert out["trunk"].shape == out["mtp"].shape == (20, vocab)
    assert list(out["next_ids"][:-1]) == ids[1:] and out["next_ids"][-1] == out["trunk"][-1].argmax()
    # row p of the draft predicts t[p+2] from t[p+1]: with PEAKED_MTP it is what the trunk says after t[p+1]
    trunk_next = out["trunk"].argmax(-1)  # trunk_next[p]: the trunk's choice after t[p]
    assert (out["mtp"].argmax(-1)[:-1] == trunk_next[1:]).mean() >= 0.9


transformers = pytest.importorskip("transformers")
needs_glm_moe_dsa = pytest.mark.skipif(
    not hasattr(transformers, "GlmMoeDsaForCausalLM"),
    reason=f"transformers {transformers.__version__} has no GlmMoeDsaForCausalLM (CI's main step has 5.x)")


def _save(directory, config: dict, weights: dict) -> str:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, str(directory / "model.safetensors"),
              metadata={"format": "np"})
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


@needs_glm_moe_dsa
@pytest.mark.parametrize("length", [40, 200])  # below and above index_topk (128): the indexer's top-k matters
def test_the_reference_matches_transformers(tmp_path, peaked, length):
    import torch

    model = peaked["peaked-mtp"]
    c, w = model.config, model.weights
    ids = list(range(20, 20 + length))
    ours = mtp_reference_logits(model, ids)

    trunk_dir = _save(tmp_path / "trunk", c, {k: v for k, v in w.items() if not k.startswith("model.layers.2.")})
    trunk = transformers.GlmMoeDsaForCausalLM.from_pretrained(trunk_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        out = trunk.model(torch.tensor([ids]))
        hidden = out.last_hidden_state[0]
        logits = trunk.lm_head(hidden).numpy()
    scale = np.abs(logits).max()
    # measured: ~4e-5 of ~12-19 (transformers keeps q_a/kv_a_layernorm at eps 1e-6 where vLLM and the reference
    # use rms_norm_eps, and sums in another order)
    assert np.abs(ours["trunk"] - logits).max() <= 1e-4 * scale
    assert (ours["trunk"].argmax(-1) == logits.argmax(-1)).mean() >= 0.99

    # the MTP layer: enorm / hnorm / eh_proj here in torch, then its block + shared_head.norm + lm_head as a
    # one-layer GlmMoeDsa model holding the MTP block's weights
    p = f"model.layers.{c['num_hidden_layers']}."
    block = {"model.layers.0." + k[len(p):]: v for k, v in w.items()
             if k.startswith(p) and not k[len(p):].startswith(("eh_proj", "enorm", "hnorm", "shared_head"))}
    block.update({"model.embed_tokens.weight": w["model.embed_tokens.weight"], "lm_head.weight": w["lm_head.weight"],
                  "model.norm.weight": w[p + "shared_head.norm.weight"]})
    one = dict(c, num_hidden_layers=1, first_k_dense_replace=0, num_nextn_predict_layers=0)
    mtp = transformers.GlmMoeDsaForCausalLM.from_pretrained(_save(tmp_path / "mtp", one, block), dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    eps = c["rms_norm_eps"]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    e = torch.from_numpy(w["model.embed_tokens.weight"])[torch.from_numpy(ours["next_ids"])]
    e[0] = 0  # vLLM masks position 0
    enorm, hnorm = torch.from_numpy(w[p + "enorm.weight"]), torch.from_numpy(w[p + "hnorm.weight"])
    x = torch.cat([rms(e, enorm), rms(hidden, hnorm)], -1) @ torch.from_numpy(w[p + "eh_proj.weight"]).T
    with torch.no_grad():
        mtp_logits = mtp(inputs_embeds=x[None]).logits[0].numpy()
    print(f"length {length}: trunk max |diff| {np.abs(ours['trunk'] - logits).max():.2e} of {scale:.1f}, MTP "
          f"{np.abs(ours['mtp'] - mtp_logits).max():.2e} of {np.abs(mtp_logits).max():.1f}")
    assert np.abs(ours["mtp"] - mtp_logits).max() <= 1e-4 * np.abs(mtp_logits).max()
    assert (ours["mtp"].argmax(-1) == mtp_logits.argmax(-1)).mean() >= 0.99

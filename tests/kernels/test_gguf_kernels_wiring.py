"""gguf-kernels wiring: vLLM's own GGUF linear and MoE methods, patched, reach the shim's kernels (run here in the
Triton interpreter on CPU tensors) and give the float64 answer; what the shim does not cover reaches vLLM's ops."""
from __future__ import annotations

import gguf
import pytest
import torch

from glm5_shim.kernels.gguf import traits
from glm5_shim.kernels.gguf import tiles as gm
from glm5_shim.kernels.gguf import reference as ref
from tests.helpers import shim_in_this_process

_TARGET = "vllm.model_executor.layers.quantization.gguf"


@pytest.fixture
def patched(monkeypatch):
    """The shim active, its drop-ins told that CPU tensors are fine (the interpreter runs the kernels here)."""
    from glm5_shim.matmul import gguf_ops

    monkeypatch.setattr(gguf_ops, "_acts_ok", lambda x: x.dtype in (torch.float16, torch.float32))
    with shim_in_this_process(_TARGET) as registry:
        patch = registry.get("gguf-kernels")
        assert patch.state == "applied", patch.as_dict()
        import importlib

        yield importlib.import_module(_TARGET)


def _merged_layer(shards: list[tuple[torch.Tensor, int]], method):
    """A GGUF merged linear as vLLM's weight loader and process_weights_after_loading leave it."""
    from vllm.model_executor.utils import set_weight_attrs

    layer = torch.nn.Module()
    qweight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    set_weight_attrs(qweight, {"shard_id": list(range(len(shards))),
                               "shard_id_map": {i: i for i in range(len(shards))},
                               "data_container": [w for w, _ in shards]})
    layer.register_parameter("qweight", qweight)
    qweight_type = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    set_weight_attrs(qweight_type, {"weight_type": shards[0][1],
                                    "shard_weight_type": {i: t for i, (_, t) in enumerate(shards)}})
    layer.register_parameter("qweight_type", qweight_type)
    method.process_weights_after_loading(layer)
    return layer


def test_the_patch_checks_vllm_and_steps_aside_when_asked(monkeypatch):
    import importlib

    from glm5_shim.patches import gguf_kernels
    from glm5_shim.registry import TargetMismatch

    module = importlib.import_module(_TARGET)
    gguf_kernels._check(module)  # the premises hold in the installed vLLM 0.23
    monkeypatch.setenv("GLM5_SHIM_GGUF_KERNELS", "vllm")
    with pytest.raises(TargetMismatch, match="GLM5_SHIM_GGUF_KERNELS=vllm"):
        gguf_kernels._check(module)


def test_a_merged_linear_of_two_types_runs_on_the_shim_kernels(patched, monkeypatch):
    """q_a (Q4_K) + kv_a (Q6_K) as vLLM pads them: vLLM's apply, patched, gives [x q_a^T | x kv_a^T]."""
    method = patched.GGUFLinearMethod(patched.GGUFConfig())
    g = torch.Generator().manual_seed(1)
    a = ref.random_blocks(traits.Q4_K, 48, 512, g)
    b = ref.random_blocks(traits.Q6_K, 40, 512, g)
    layer = _merged_layer([(a, traits.Q4_K), (b, traits.Q6_K)], method)
    calls = []
    original = gm.gguf_linear
    monkeypatch.setattr(gm, "gguf_linear", lambda *args, **kw: calls.append(args[2]) or original(*args, **kw))
    x = torch.randn(9, 512, generator=g)  # above vLLM's vector-kernel rows: the shim's kernel
    got = method.apply(layer, x)
    want = torch.cat([ref.linear_reference(x, a, traits.Q4_K), ref.linear_reference(x, b, traits.Q6_K)], dim=1)
    assert calls == [traits.Q4_K, traits.Q6_K]
    assert got.shape == (9, 88) and ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_one_type_shards_run_as_one_launch(patched, monkeypatch):
    method = patched.GGUFLinearMethod(patched.GGUFConfig())
    g = torch.Generator().manual_seed(2)
    gate, up = ref.random_blocks(traits.Q8_0, 32, 256, g), ref.random_blocks(traits.Q8_0, 32, 256, g)
    layer = _merged_layer([(gate, traits.Q8_0), (up, traits.Q8_0)], method)
    calls = []
    original = gm.gguf_linear
    monkeypatch.setattr(gm, "gguf_linear", lambda *args, **kw: calls.append(args[1].shape[0]) or original(*args, **kw))
    x = torch.randn(7, 256, generator=g)
    got = method.apply(layer, x)
    want = torch.cat([ref.linear_reference(x, gate, traits.Q8_0), ref.linear_reference(x, up, traits.Q8_0)], dim=1)
    assert calls == [64] and ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_few_rows_and_uncovered_types_reach_vllms_kernels(patched, monkeypatch):
    """One row (in fp16) goes to vLLM's vector kernel, with exact rows cut from a padded shard (two rows do not:
    routing.VLLM_LINEAR_MAX_ROWS); a type without a shim kernel and a K that is not whole super-blocks go to
    vLLM's op untouched."""
    seen = []
    monkeypatch.setattr(patched, "_fused_mul_mat_gguf",
                        lambda x, w, t: seen.append((x.shape[0], tuple(w.shape), t)) or torch.zeros(x.shape[0],
                                                                                                    w.shape[0]))
    from glm5_shim.matmul import gguf_ops

    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: x.dtype == torch.float16)
    g = torch.Generator().manual_seed(3)
    padded = torch.zeros(8, 300, dtype=torch.uint8)
    padded[:, :288] = ref.random_blocks(traits.Q4_K, 8, 512, g)
    gguf_ops._linear_op(torch.randn(1, 512).half(), padded, traits.Q4_K, 8)
    assert seen == [(1, (8, 288), traits.Q4_K)]
    got = gguf_ops._linear_op(torch.randn(2, 512).half(), padded, traits.Q4_K, 8)
    assert len(seen) == 1 and got.shape == (2, 8)
    fallback = []
    drop_in = gguf_ops.make_fused_mul_mat(lambda x, w, t: fallback.append(t) or "vllm")
    tq1 = int(gguf.GGMLQuantizationType.TQ1_0)  # a type the shim has no kernel for
    assert drop_in(torch.randn(9, 512), torch.zeros(4, 108, dtype=torch.uint8), tq1) == "vllm"
    assert drop_in(torch.randn(9, 320), torch.zeros(4, 340, dtype=torch.uint8), traits.Q8_0) == "vllm"
    assert fallback == [tq1, traits.Q8_0]


def test_register_mma_decode_takes_the_rows_vllms_vector_kernel_may_not(patched, monkeypatch):
    """By default (GLM5_SHIM_GGUF_DECODE unset): a 1-row Q4_K linear (a padded shard view) goes to vLLM's vector
    kernel where that is trusted (it beats both shim kernels at 1 row), and where it is not (bf16 from compute
    capability 10) runs on the register-MMA kernel, reading the shard in place; at 2 rows the register-MMA kernel
    runs even where vLLM's is trusted (vLLM's time grows with each row); a Q8_0 linear at 7 rows stays on the tile
    kernel (its register-MMA dense decode measured no faster), and GLM5_SHIM_GGUF_DECODE=tile keeps Q4_K there."""
    from glm5_shim.kernels.gguf import register_mma as gguf_mma
    from glm5_shim.matmul import gguf_ops

    seen, launched = [], []
    monkeypatch.setattr(patched, "_fused_mul_mat_gguf",
                        lambda x, w, t: seen.append(t) or torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype))
    real = gguf_mma.launch
    monkeypatch.setattr(gguf_mma, "launch", lambda *a, **kw: (launched.append(a[1].shape), real(*a, **kw))[1])
    monkeypatch.delenv("GLM5_SHIM_GGUF_DECODE", raising=False)
    g = torch.Generator().manual_seed(8)
    w = ref.random_blocks(traits.Q4_K, 8, 512, g)
    padded = torch.zeros(8, 304, dtype=torch.uint8)
    padded[:, :288] = w
    x = torch.randn(1, 512, generator=g).half()
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: True)
    gguf_ops._linear_op(x, padded, traits.Q4_K, 8)
    assert seen == [traits.Q4_K] and not launched
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: False)
    got = gguf_ops._linear_op(x, padded, traits.Q4_K, 8)
    assert launched == [(8, 304)] and seen == [traits.Q4_K]
    want = ref.linear_reference(x, w, traits.Q4_K)
    assert ((got.double() - want).norm() / want.norm()).item() < 3e-3
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: True)
    x2 = torch.randn(2, 512, generator=g).half()
    got2 = gguf_ops._linear_op(x2, padded, traits.Q4_K, 8)
    assert launched == [(8, 304)] * 2 and seen == [traits.Q4_K]
    want2 = ref.linear_reference(x2, w, traits.Q4_K)
    assert ((got2.double() - want2).norm() / want2.norm()).item() < 3e-3
    w8 = ref.random_blocks(traits.Q8_0, 8, 512, g)
    x7 = torch.randn(7, 512, generator=g).half()
    got8 = gguf_ops._linear_op(x7, w8, traits.Q8_0, 8)
    assert launched == [(8, 304)] * 2
    want8 = ref.linear_reference(x7, w8, traits.Q8_0)
    assert ((got8.double() - want8).norm() / want8.norm()).item() < 3e-3
    monkeypatch.setenv("GLM5_SHIM_GGUF_DECODE", "tile")
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: False)
    gguf_ops._linear_op(x, padded, traits.Q4_K, 8)
    assert launched == [(8, 304)] * 2 and seen == [traits.Q4_K]


def test_vllms_moe_method_runs_on_the_shim_kernels(patched):
    """fused_moe_gguf as GGUFMoEMethod.apply calls it (the patched module global), against float64."""
    g = torch.Generator().manual_seed(4)
    e, h, inter, t, top_k = 4, 256, 256, 3, 2
    w13 = torch.stack([ref.random_blocks(traits.Q4_K, 2 * inter, h, g) for _ in range(e)])
    w2 = torch.stack([ref.random_blocks(traits.Q6_K, h, inter, g) for _ in range(e)])
    x = torch.randn(t, h, generator=g)
    ids = torch.tensor([[0, 2], [1, 3], [2, 0]], dtype=torch.int32)
    wts = torch.rand(t, top_k, generator=g)
    from glm5_shim.matmul import gguf_ops

    gguf_ops.register_ops()
    from glm5_shim.kernels.gguf.tiles import gguf_moe

    # the op itself uses vLLM's CUDA moe_align_block_size; on the CPU the drop-in's op is replaced by the kernel
    # entry point with the shim's torch alignment, which is what the op does apart from that choice
    original_op = torch.ops.vllm.glm5_gguf_moe
    try:
        torch.ops.vllm.glm5_gguf_moe = lambda *a: gguf_moe(*a)
        got = patched.fused_moe_gguf(x, w13, w2, wts, ids, traits.Q4_K, traits.Q6_K, "silu")
    finally:
        torch.ops.vllm.glm5_gguf_moe = original_op
    want = ref.moe_reference(x, w13, w2, wts, ids, traits.Q4_K, traits.Q6_K)
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_iq_moe_decode_goes_to_vllm_where_it_was_faster_and_trusted(patched, monkeypatch):
    """An IQ2_XS MoE of up to 32 tokens goes to vLLM's vector MoE kernel where vLLM's kernels are trusted with the
    activations (routing.VLLM_MOE_DECODE_TOKENS); 33 tokens, bf16 where vLLM is refused it, a K-quant, or
    IQ2_XXS, IQ2_S and IQ3_XXS (on the register-MMA kernel, faster than vLLM's: the UD-IQ2_M mix stays on the shim at
    every T) go to the shim's kernels; a register-MMA w13 with a vLLM-faster w2 goes to vLLM at 1 token only
    (MIXED_...)."""
    from glm5_shim.kernels.gguf.routing import VLLM_MOE_DECODE_TOKENS
    from glm5_shim.matmul import gguf_ops

    iq2s = int(gguf.GGMLQuantizationType.IQ2_S)
    iq2xxs = int(gguf.GGMLQuantizationType.IQ2_XXS)
    iq2xs = int(gguf.GGMLQuantizationType.IQ2_XS)
    iq3xxs = int(gguf.GGMLQuantizationType.IQ3_XXS)
    assert VLLM_MOE_DECODE_TOKENS[iq2xs] == 32
    assert not {iq2xxs, iq2s, iq3xxs} & set(VLLM_MOE_DECODE_TOKENS)
    went = []
    monkeypatch.setattr(patched, "_fused_moe_gguf", lambda x, *a: went.append(("vllm", x.shape[0])) or x)
    monkeypatch.setattr(gm, "gguf_moe", lambda x, *a, **kw: went.append(("shim", x.shape[0])) or x)
    w = torch.zeros(1, 1, dtype=torch.uint8)
    ids, wts = torch.zeros(33, 8, dtype=torch.int32), torch.zeros(33, 8)
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: True)
    for t, q13, q2 in ((32, iq2xs, iq2xs), (33, iq2xs, iq2xs), (1, traits.Q4_K, traits.Q4_K), (2, iq2xxs, iq2xxs),
                       (1, iq2s, iq2s), (1, iq2xxs, iq2s), (2, iq2xxs, iq2s), (1, iq2xxs, iq2xs), (2, iq2xxs, iq2xs),
                       (1, iq3xxs, iq3xxs)):
        gguf_ops._moe_op(torch.zeros(t, 256), w, w, wts[:t], ids[:t], q13, q2)
    iq3s = int(gguf.GGMLQuantizationType.IQ3_S)  # vLLM decodes it wrongly (VLLM_MISDECODED_TYPES): never there
    gguf_ops._moe_op(torch.zeros(1, 256), w, w, wts[:1], ids[:1], iq2xs, iq3s)
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: False)
    gguf_ops._moe_op(torch.zeros(1, 256), w, w, wts[:1], ids[:1], iq2xs, iq2xs)
    assert went == [("vllm", 32), ("shim", 33), ("shim", 1), ("shim", 2), ("shim", 1), ("shim", 1), ("shim", 2),
                    ("vllm", 1), ("shim", 2), ("shim", 1), ("shim", 1), ("shim", 1)]


def test_iq3_s_never_reaches_vllms_kernels(patched, monkeypatch):
    """A 1-row IQ3_S linear, where vLLM's vector kernel is trusted and would take a 1-row Q4_K, runs on the shim's
    kernel: vLLM 0.23 reads IQ3_S's top grid level as 15.5 (routing.VLLM_MISDECODED_TYPES)."""
    from glm5_shim.matmul import gguf_ops

    seen = []
    monkeypatch.setattr(patched, "_fused_mul_mat_gguf",
                        lambda x, w, t: seen.append(t) or torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype))
    monkeypatch.setattr(gguf_ops, "_vllm_vector_kernel_trusted", lambda x: True)
    iq3s = int(gguf.GGMLQuantizationType.IQ3_S)
    g = torch.Generator().manual_seed(13)
    w = ref.random_blocks(iq3s, 8, 256, g)
    x = torch.randn(1, 256, generator=g).half()
    got = gguf_ops._linear_op(x, w, iq3s, 8)
    gguf_ops._linear_op(x, ref.random_blocks(traits.Q4_K, 8, 256, g), traits.Q4_K, 8)
    assert seen == [traits.Q4_K]
    want = ref.linear_reference(x, w, iq3s)
    assert ((got.double() - want).norm() / want.norm()).item() < 3e-3


def _single_linear(w: torch.Tensor, qtype: int, module_class=torch.nn.Module):
    """A GGUF linear (or, with module_class, an embedding) holding one weight, as vLLM's loader leaves it."""
    from vllm.model_executor.utils import set_weight_attrs

    layer = module_class.__new__(module_class)
    torch.nn.Module.__init__(layer)
    qweight = torch.nn.Parameter(w.clone(), requires_grad=False)
    set_weight_attrs(qweight, {"shard_id": [], "shard_id_map": {}, "data_container": []})
    layer.register_parameter("qweight", qweight)
    qweight_type = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    set_weight_attrs(qweight_type, {"weight_type": qtype, "shard_weight_type": {}})
    layer.register_parameter("qweight_type", qweight_type)
    return layer


def _experts(w13: torch.Tensor, q13: int, w2: torch.Tensor, q2: int, method):
    layer = torch.nn.Module()
    layer.quant_method = method
    for name, w, qt in (("w13", w13, q13), ("w2", w2, q2)):
        layer.register_parameter(f"{name}_qweight", torch.nn.Parameter(w.clone(), requires_grad=False))
        qtype = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        qtype.weight_type = qt
        layer.register_parameter(f"{name}_qweight_type", qtype)
    return layer


def test_repacked_weights_run_packed_and_give_the_file_layouts_outputs(patched, monkeypatch):
    """loading/gguf_repack.repack_model on vLLM's GGUF layers as its loader leaves them: a merged Q8_0 + Q6_K
    linear (both shards in place, their types recorded packed), a Q6_K linear at K = 256 (rows grow from 210 to 224
    bytes: a new tensor), an IQ2_XXS linear at K = 256 (rows from 66 to 72 bytes), a Q4_K linear (no packed layout:
    untouched), an embedding (vLLM's lookup reads the file's
    layout: untouched), experts of Q8_0 w13 and a Q6_K w2 at K = 256.  Every weight is pack()'s bytes of the file's;
    vLLM's patched apply and fused_moe_gguf read them packed and give the file layout's outputs bit for bit; a second
    pass repacks nothing; packing is off with GLM5_SHIM_GGUF_PACK=0 or vLLM's kernels."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from glm5_shim.kernels.gguf.routing import is_packed, packed_type
    from glm5_shim.kernels.gguf import register_mma as gguf_mma
    from glm5_shim.loading import gguf_repack

    g = torch.Generator().manual_seed(17)
    method = patched.GGUFLinearMethod(patched.GGUFConfig())
    a = ref.quantized_blocks(traits.Q8_0, torch.randn(48, 2048, generator=g) * 0.02)
    b = ref.quantized_blocks(traits.Q6_K, torch.randn(40, 2048, generator=g) * 0.02)
    c = ref.quantized_blocks(traits.Q6_K, torch.randn(24, 256, generator=g) * 0.02)
    d = ref.random_blocks(traits.Q4_K, 16, 256, g)
    f = ref.random_blocks(traits.IQ2_XXS, 16, 256, g)
    e13 = torch.stack([ref.quantized_blocks(traits.Q8_0, torch.randn(512, 256, generator=g) * 0.02) for _ in range(4)])
    e2 = torch.stack([ref.quantized_blocks(traits.Q6_K, torch.randn(256, 256, generator=g) * 0.02) for _ in range(4)])
    moe_method = patched.GGUFMoEMethod.__new__(patched.GGUFMoEMethod)

    def build():
        root = torch.nn.Module()
        root.merged = _merged_layer([(a, traits.Q8_0), (b, traits.Q6_K)], method)
        root.single = _single_linear(c, traits.Q6_K)
        root.q4k = _single_linear(d, traits.Q4_K)
        root.iq2 = _single_linear(f, traits.IQ2_XXS)
        root.embed = _single_linear(c, traits.Q6_K, VocabParallelEmbedding)
        for name in ("merged", "single", "q4k", "iq2", "embed"):
            getattr(root, name).quant_method = patched.GGUFEmbeddingMethod(patched.GGUFConfig()) \
                if name == "embed" else method
        root.experts = _experts(e13, traits.Q8_0, e2, traits.Q6_K, moe_method)
        return root

    assert gguf_repack.packing_enabled()
    file_, packed = build(), build()
    tally = gguf_repack.repack_model(packed, device_types=("cpu",))
    assert tally.tensors == 6 and tally.by_type == {"Q8_0": 2, "Q6_K": 3, "IQ2_XXS": 1}, tally
    assert "repacked 6 GGUF weights" in tally.summary()
    types = packed.merged.qweight_type.shard_weight_type
    assert types == {0: packed_type(traits.Q8_0), 1: packed_type(traits.Q6_K)}
    assert torch.equal(packed.merged.qweight[:48], gguf_mma.pack(a, traits.Q8_0))
    assert torch.equal(packed.merged.qweight[48:, :1680], gguf_mma.pack(b, traits.Q6_K))
    assert packed.single.qweight.shape == (24, 224)
    assert torch.equal(packed.single.qweight, gguf_mma.pack(c, traits.Q6_K))
    assert is_packed(packed.single.qweight_type.weight_type)
    assert torch.equal(packed.iq2.qweight, gguf_mma.pack(f, traits.IQ2_XXS))
    assert packed.iq2.qweight.shape[1] > f.shape[1]
    assert packed.iq2.qweight_type.weight_type == packed_type(traits.IQ2_XXS)
    for untouched in ("q4k", "embed"):
        assert torch.equal(getattr(packed, untouched).qweight, getattr(file_, untouched).qweight)
        assert not is_packed(getattr(packed, untouched).qweight_type.weight_type)
    assert torch.equal(packed.experts.w2_qweight, gguf_mma.pack(e2, traits.Q6_K))
    assert packed.experts.w13_qweight_type.weight_type == packed_type(traits.Q8_0)
    # vLLM's methods, patched, on both: 9 rows (the tile kernels), 3 rows (register MMA), 130 (dequantized)
    for rows in (9, 3, 130):
        x = torch.randn(rows, 2048, generator=g).half()
        assert torch.equal(method.apply(packed.merged, x), method.apply(file_.merged, x)), rows
        x = x[:, :256]
        assert torch.equal(method.apply(packed.single, x), method.apply(file_.single, x)), rows
        assert torch.equal(method.apply(packed.iq2, x), method.apply(file_.iq2, x)), rows
    from glm5_shim.matmul import gguf_ops
    import vllm.model_executor.layers.fused_moe.moe_align_block_size as align_module

    monkeypatch.setattr(align_module, "moe_align_block_size", lambda ids, bm, e: gm.moe_align(ids, bm, e))
    for t in (2, 40):
        x = torch.randn(t, 256, generator=g).half()
        ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(t)]).to(torch.int32)
        wts = torch.rand(t, 2, generator=g)
        got = gguf_ops._moe_op(x, packed.experts.w13_qweight, packed.experts.w2_qweight, wts, ids,
                               packed.experts.w13_qweight_type.weight_type, packed.experts.w2_qweight_type.weight_type)
        want = gguf_ops._moe_op(x, e13, e2, wts, ids, traits.Q8_0, traits.Q6_K)
        assert torch.equal(got, want), t
    # vLLM's kernels are never handed a packed weight: float32 activations there are refused in one line
    with pytest.raises(RuntimeError, match="repacked at load"):
        patched.fused_mul_mat_gguf(torch.randn(2, 256).double(), packed.single.qweight,
                                   packed.single.qweight_type.weight_type)
    assert gguf_repack.repack_model(packed, device_types=("cpu",)).tensors == 0   # already packed
    assert gguf_repack.repack_model(build()).tensors == 0                          # CPU weights, CUDA only
    monkeypatch.setenv("GLM5_SHIM_GGUF_PACK", "0")
    assert not gguf_repack.packing_enabled()
    monkeypatch.delenv("GLM5_SHIM_GGUF_PACK")
    from glm5_shim.registry import REGISTRY

    REGISTRY.get("gguf-kernels").undo()
    assert not gguf_repack.packing_enabled()   # vLLM's own kernels: nothing may be packed


def test_only_a_process_that_loaded_a_glm_gguf_gives_its_matmuls_to_the_shim(monkeypatch):
    """The drop-ins take a call only after the process loaded a glm-dsa GGUF (patches/gguf_loader.py marks it):
    another GGUF model served with the shim active keeps vLLM's kernels (issue #51)."""
    from types import SimpleNamespace

    from glm5_shim.matmul import gguf_ops

    monkeypatch.setattr(gguf_ops, "_glm_gguf_loaded", False)
    x = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, shape=(2, 512))
    went = []
    drop_in = gguf_ops.make_fused_mul_mat(lambda x, w, t: went.append("vllm") or "vllm")
    assert not gguf_ops._acts_ok(x) and drop_in(x, None, 12) == "vllm" and went == ["vllm"]
    gguf_ops.mark_glm_gguf_loaded()
    assert gguf_ops.glm_gguf_loaded() and gguf_ops._acts_ok(x)
    assert not gguf_ops._acts_ok(SimpleNamespace(is_cuda=False, dtype=torch.bfloat16))

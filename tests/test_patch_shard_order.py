"""gguf-shard-order: a quantized fused linear whose shards arrived kv_a first is applied q_a first."""
from __future__ import annotations

import pytest
import torch

from glm5_shim.patches.gguf_shard_order import sort_integer_shard_ids
from tests.helpers import shim_in_this_process

Q8_0 = 8  # GGMLQuantizationType.Q8_0


def _fused_layer(arrival: list[int]) -> torch.nn.Module:
    """The state MergedColumnParallelLinear.weight_loader leaves for a GGUF fused linear after its shards arrived in
    `arrival` order: data_container in arrival order, shard_id_map id → container slot, shard_id in arrival order.
    Shard s's rows are filled with s + 1 (shard 0: 3 rows of 34 bytes, shard 1: 2 rows of 17 bytes)."""
    from vllm.model_executor.utils import set_weight_attrs

    shapes = {0: (3, 34), 1: (2, 17)}
    container = [torch.full(shapes[s], s + 1, dtype=torch.uint8) for s in arrival]
    layer = torch.nn.Module()
    qweight = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    set_weight_attrs(qweight, {"shard_id": list(arrival), "shard_id_map": {s: i for i, s in enumerate(arrival)},
                               "data_container": container})
    layer.register_parameter("qweight", qweight)
    qweight_type = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    set_weight_attrs(qweight_type, {"weight_type": Q8_0, "shard_weight_type": {0: Q8_0, 1: Q8_0}})
    layer.register_parameter("qweight_type", qweight_type)
    return layer


def _rows_as_apply_reads_them(layer) -> list[int]:
    """GGUFLinearMethod.apply's walk: shards in qweight.shard_id order, each located through shard_offset_map."""
    q = layer.qweight
    return [int(q[start:end, :size].unique().item())
            for start, end, size in (q.shard_offset_map[i] for i in q.shard_id)]


@pytest.fixture
def method():
    with shim_in_this_process("vllm.model_executor.layers.quantization.gguf") as registry:
        from vllm.model_executor.layers.quantization.gguf import GGUFConfig, GGUFLinearMethod

        assert registry.get("gguf-shard-order").state == "applied", registry.get("gguf-shard-order").as_dict()
        yield GGUFLinearMethod(GGUFConfig())


def test_sort_integer_shard_ids():
    class Q:
        pass

    q = Q()
    q.shard_id = [1, 0]
    assert sort_integer_shard_ids(q) and q.shard_id == [0, 1]
    assert not sort_integer_shard_ids(q) and q.shard_id == [0, 1]
    q.shard_id = ["k", "q", "v"]  # QKVParallelLinear: apply re-sorts these itself
    assert not sort_integer_shard_ids(q) and q.shard_id == ["k", "q", "v"]
    q.shard_id = []
    assert not sort_integer_shard_ids(q)


@pytest.mark.parametrize("arrival", [[1, 0], [0, 1]])
def test_file_order_kv_a_first_is_applied_q_a_first(method, arrival):
    layer = _fused_layer(arrival)
    method.process_weights_after_loading(layer)
    assert layer.qweight.shard_id == [0, 1]
    assert _rows_as_apply_reads_them(layer) == [1, 2]
    assert layer.qweight.shape == (5, 34)


def test_stock_vllm_applies_arrival_order(method):
    """The premise: vLLM's own process_weights_after_loading (the patch's __wrapped__) keeps kv_a-first arrival, so
    apply reads [kv_a | q_a]."""
    from vllm.model_executor.layers.quantization.gguf import GGUFLinearMethod

    stock = GGUFLinearMethod.process_weights_after_loading.__wrapped__
    layer = _fused_layer([1, 0])
    stock(method, layer)
    assert layer.qweight.shard_id == [1, 0]
    assert _rows_as_apply_reads_them(layer) == [2, 1]


def test_the_block_leaves_vllm_stock():
    """shim_in_this_process undoes what it applied: the pytest process is stock vLLM after it."""
    from vllm.model_executor.layers.quantization.gguf import GGUFLinearMethod

    with shim_in_this_process("vllm.model_executor.layers.quantization.gguf"):
        assert hasattr(GGUFLinearMethod.process_weights_after_loading, "__wrapped__")
    assert not hasattr(GGUFLinearMethod.process_weights_after_loading, "__wrapped__")


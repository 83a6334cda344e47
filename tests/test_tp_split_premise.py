"""The premise of the tp-split-check patch, checked against the installed vLLM: RowParallelLinear's weight loader
splits a GGUF quantized weight's packed rows into tp equal byte ranges, whatever the block size.  For a Q4_K row of
256 values (one 144-byte block) at TP 2 each rank gets 72 bytes: half a block.  If vLLM ever splits on blocks, this
test fails and the check can go."""
from __future__ import annotations


import gguf

from tests.helpers import USE_CPU_PLATFORM, last_json, run_python, script


def test_vllm_splits_gguf_rows_by_bytes_not_blocks():
    proc = run_python(script(USE_CPU_PLATFORM, """
        import json, torch
        from torch.nn.parameter import UninitializedParameter
        from vllm.model_executor.layers.linear import RowParallelLinear

        rows = torch.arange(4 * 144, dtype=torch.uint8).reshape(4, 144)  # 4 rows x one Q4_K block each
        out = {}
        for rank in (0, 1):
            param = UninitializedParameter(requires_grad=False)
            param.is_gguf_weight, param.input_dim, param.output_dim = True, 1, 0
            fake = type("Fake", (), {"tp_size": 2, "tp_rank": rank})()
            RowParallelLinear.weight_loader(fake, param, rows.clone())
            out[rank] = [list(param.shape), int(param.data[0, 0]), int(param.data[0, -1])]
        print(json.dumps(out))
    """))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc)
    block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1]
    assert block_bytes == 144
    assert out == {"0": [[4, 72], 0, 71], "1": [[4, 72], 72, 143]}  # each rank: half of every block

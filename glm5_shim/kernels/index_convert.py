"""Request-local top-k positions → global KV-cache slots, with -1 kept for invalid entries.

The indexer writes, for each query token, positions inside its own request; attention needs physical slots:
slot = block_table[req, pos // block_size] * block_size + pos % block_size.  Positions outside the request's
block table (or negative) become -1, so the attention kernel skips them.

vLLM has the same conversion (v1/attention/backends/mla/sparse_utils.py: triton_convert_req_index_to_global_index);
it is not used because it requires top-k to be a multiple of 128 (tests and tiny models use others) and its kernel is
compiled through vLLM's triton import, which is a placeholder on a machine without a GPU driver, so the CPU
interpreter tests could not run it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _convert_kernel(pos_ptr, pos_stride, req_ptr, bt_ptr, bt_stride, out_ptr, out_stride, topk, max_blocks,
                    BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_range = cols < topk
    pos = tl.load(pos_ptr + token * pos_stride + cols, mask=in_range, other=-1)
    req = tl.load(req_ptr + token)
    block = pos // BLOCK_SIZE
    valid = (pos >= 0) & (block < max_blocks)
    base = tl.load(bt_ptr + req.to(tl.int64) * bt_stride + block, mask=valid & in_range, other=0)
    slot = tl.where(valid, base * BLOCK_SIZE + pos % BLOCK_SIZE, -1)
    tl.store(out_ptr + token * out_stride + cols, slot, mask=in_range)


def convert_to_global_slots(positions: torch.Tensor, req_id_per_token: torch.Tensor, block_table: torch.Tensor,
                            block_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """positions int32 [T, K] (request-local, -1 invalid), req_id_per_token int32 [T], block_table int32
    [R, max_blocks] → int32 [T, K] global slots (-1 invalid)."""
    tokens, topk = positions.shape
    if out is None:
        out = torch.empty_like(positions, dtype=torch.int32)
    if tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(topk))
    _convert_kernel[(tokens, triton.cdiv(topk, block))](
        positions, positions.stride(0), req_id_per_token, block_table, block_table.stride(0), out, out.stride(0),
        topk, block_table.shape[1], BLOCK_SIZE=block_size, BLOCK=block)
    return out


def convert_to_global_slots_reference(positions, req_id_per_token, block_table, block_size):
    pos = positions.long()
    blocks = pos // block_size
    valid = (pos >= 0) & (blocks < block_table.shape[1])
    rows = block_table[req_id_per_token.long()]  # [T, max_blocks]
    base = torch.gather(rows, 1, blocks.clamp(0, block_table.shape[1] - 1)).long()
    return torch.where(valid, base * block_size + pos % block_size, torch.full_like(pos, -1)).to(torch.int32)

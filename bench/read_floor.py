"""What reading a GGUF matmul's weights costs with nothing else done: the measuring stick under bench/gguf_matmul.py's
% of floor (issue #15's decode targets).

The bandwidth floor (bytes / copy bandwidth) assumes a 2 GiB stream.  A decode MoE reads ~20-400 MB in two launches
that depend on each other (w13, then w2), a dense decode linear 1-50 MB in one: launch latency, the ramp to full
bandwidth and the tail of the last wave cost a fixed few µs that the floor does not count.  These kernels read exactly
those bytes in the same launches and do nothing with them but a checksum, so a kernel's time against theirs separates
what its own work costs from what any reader of that access pattern pays:

  * read_experts: one launch over the distinct experts of a routing (a list padded with -1, as the MoE's sorted path
    reads each once), each program XOR-ing CHUNK_WORDS int32 words of one expert's slab;
  * read_weight: one launch over a whole weight (a dense linear's).
Both write one int32 (the XOR of the words read) a program: nothing the compiler may drop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_WORDS = 4096  # int32 words a program reads (16 KiB): enough loads in flight, a few programs an SM


@triton.jit
def _read_experts_kernel(w_ptr, ids_ptr, out_ptr, expert_words, chunks, CHUNK: tl.constexpr):
    slot = tl.program_id(0)
    chunk = tl.program_id(1)
    expert = tl.load(ids_ptr + slot)
    if expert >= 0:
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        words = tl.load(w_ptr + expert.to(tl.int64) * expert_words + offs, mask=offs < expert_words, other=0)
        tl.store(out_ptr + slot * chunks + chunk, tl.xor_sum(words, axis=0))


@triton.jit
def _read_weight_kernel(w_ptr, out_ptr, words, CHUNK: tl.constexpr):
    chunk = tl.program_id(0)
    offs = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    tl.store(out_ptr + chunk, tl.xor_sum(tl.load(w_ptr + offs, mask=offs < words, other=0), axis=0))


def _as_words(w: torch.Tensor, parts: int = 1) -> torch.Tensor:
    """A uint8 weight as [parts, words] int32 (parts: experts).  Each part must be a whole number of words; a row
    need not be (an IQ2_XXS row of 256 values is 66 bytes, its expert of 6144 rows is not)."""
    per = w.numel() // parts
    if per % 4:
        raise ValueError(f"{'an expert' if parts > 1 else 'the weight'} of {per} bytes is not a whole number of int32 "
                         "words")
    return w.contiguous().reshape(-1).view(torch.int32).reshape(parts, -1)


def distinct_experts(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The experts a routing touches, each once, padded with -1 to num_experts slots (computed before a graph is
    captured: it syncs)."""
    ids = torch.full((num_experts,), -1, dtype=torch.int32, device=topk_ids.device)
    uniq = topk_ids.reshape(-1).unique()
    ids[: uniq.numel()] = uniq.to(torch.int32)
    return ids


def experts_checksums(w: torch.Tensor, slots: int) -> torch.Tensor:
    """read_experts' output for w [E, rows, row bytes] and this many slots, zeroed (allocate before a graph)."""
    return torch.zeros(slots, triton.cdiv(w[0].numel() // 4, CHUNK_WORDS), dtype=torch.int32, device=w.device)


def weight_checksums(w: torch.Tensor) -> torch.Tensor:
    """read_weight's output for w (allocate before a graph)."""
    return torch.empty(triton.cdiv(w.numel() // 4, CHUNK_WORDS), dtype=torch.int32, device=w.device)


def read_experts(w: torch.Tensor, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read every byte of the experts listed in slots (-1: none) of w [E, rows, row bytes]; [slots, chunks] int32
    XOR checksums (an empty slot's entries stay as out had them: zeros when out is not given)."""
    words = _as_words(w, w.shape[0])
    out = out if out is not None else experts_checksums(w, slots.numel())
    chunks = out.shape[1]
    _read_experts_kernel[(slots.numel(), chunks)](words, slots, out, words.shape[1], chunks, CHUNK=CHUNK_WORDS)
    return out


def read_weight(w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Read every byte of w once; [chunks] int32 XOR checksums."""
    words = _as_words(w).reshape(-1)
    out = out if out is not None else weight_checksums(w)
    _read_weight_kernel[(out.numel(),)](words, out, words.numel(), CHUNK=CHUNK_WORDS)
    return out

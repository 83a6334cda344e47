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

import gguf
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


# ---------------------------------------------------------------------------------------------------------------
# Load width: the code bytes of 2-byte-aligned blocks read as the register-MMA kernel reads them, against the same
# bytes 16-byte aligned.  register_mma.py gives each thread 16 contiguous code bytes of a row ("a piece"; the 4
# lanes of a row take 4 consecutive pieces, 8 rows a warp).  Where blocks are 16-byte aligned (Q4_K, 144 B) a piece
# is one 16-byte load; where they are only 2-byte aligned (Q6_K 210 B, Q8_0 34 B, IQ2_XXS 66 B) it is eight 2-byte
# loads, each touching 8 rows' cache lines for 64 useful bytes.  read_pieces times both patterns over one weight.

# (block bytes, bytes at the block's start before its codes, 16-byte pieces of codes a block) as the kernels read
# them: Q4_K's 128 codes after its 16-byte header, Q6_K's 128 low-nibble + 64 high-bit bytes, Q8_0's 32 codes after
# d, IQ2_XXS's 64 bytes after d (block bytes from the gguf package: 144, 210, 34, 66)
PIECE_LAYOUTS = {name: (gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][1], skip, pieces)
                 for name, skip, pieces in (("Q4_K", 16, 8), ("Q6_K", 0, 12), ("Q8_0", 2, 2), ("IQ2_XXS", 2, 4))}
SLOTS = 4          # consecutive pieces a row's lanes take
PIECE_ROWS = 64    # rows a program reads (16 a warp, as the MMA kernel's BN with 4 warps)


@triton.jit
def _read_pieces_kernel(w_ptr, out_ptr, row_bytes, pieces_per_row, groups_per_split,
                        STRIDE: tl.constexpr, SKIP: tl.constexpr, PIECES: tl.constexpr, WIDE: tl.constexpr,
                        ROWS: tl.constexpr):
    """XOR of the int32 words of every code piece of ROWS rows x one split of the row's pieces.  Piece q of a row
    is the 16 bytes at (q // PIECES) STRIDE + SKIP + 16 (q % PIECES); program_id(1) takes groups of SLOTS pieces.
    WIDE: one 16-byte load a piece (the bytes must be 16-byte aligned); else eight 2-byte loads."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    slot = tl.arange(0, 4)
    row_p = w_ptr + r.to(tl.int64)[:, None] * row_bytes                      # [ROWS, 1]
    acc = tl.zeros([ROWS, 4], dtype=tl.int32)
    g0 = tl.program_id(1) * groups_per_split
    for g in range(g0, g0 + groups_per_split):
        q = 4 * g + slot                                                     # [4] pieces of this group
        ok = (q < pieces_per_row)[None, :]
        piece = row_p + ((q // PIECES) * STRIDE + SKIP + 16 * (q % PIECES))[None, :]   # [ROWS, 4] byte pointers
        if WIDE:
            words = tl.multiple_of(piece, [16, 16]).to(tl.pointer_type(tl.int32))[:, :, None] \
                + tl.arange(0, 4)[None, None, :]
            acc ^= tl.xor_sum(tl.load(words, mask=ok[:, :, None], other=0), axis=2)
        else:
            halves = piece.to(tl.pointer_type(tl.int16))
            for h in tl.static_range(8):
                v = tl.load(halves + h, mask=ok, other=0).to(tl.int32) & 0xFFFF
                acc ^= v << (16 * (h % 2))
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), tl.xor_sum(tl.xor_sum(acc, 1), 0))


def piece_layout(type_name: str, packed: bool) -> tuple[int, int, int]:
    """(stride, skip, pieces) of a type's code pieces: as the file lays them out, or (packed) the same code bytes
    with nothing between them, 16-byte aligned (what a repack at load time would give the kernels)."""
    stride, skip, pieces = PIECE_LAYOUTS[type_name]
    return (16 * pieces, 0, pieces) if packed else (stride, skip, pieces)


def wide_loads_fit(type_name: str, packed: bool) -> bool:
    """Whether piece_layout(type_name, packed) puts every piece on a 16-byte boundary (rows of whole blocks from an
    aligned start), so that read_pieces may read it with 16-byte loads."""
    stride, skip, _ = piece_layout(type_name, packed)
    return stride % 16 == 0 and skip % 16 == 0


def read_pieces(w: torch.Tensor, type_name: str, packed: bool, wide: bool, splits: int = 1,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Read the code pieces of every row of w [rows, row bytes] (uint8) laid out as piece_layout(type_name, packed)
    says, with 16-byte loads (wide) or 2-byte loads; [splits, row programs] int32 XOR checksums."""
    stride, skip, pieces = piece_layout(type_name, packed)
    rows, row_bytes = w.shape
    blocks = row_bytes // stride
    if blocks * stride != row_bytes:
        raise ValueError(f"{type_name}: rows of {row_bytes} bytes are not whole {stride}-byte blocks")
    if wide and not (wide_loads_fit(type_name, packed) and row_bytes % 16 == 0):
        raise ValueError(f"{type_name}: {stride}-byte blocks with codes at +{skip} are not 16-byte aligned: "
                         "2-byte loads only")
    if rows % PIECE_ROWS:
        raise ValueError(f"{rows} rows: a multiple of {PIECE_ROWS} is read")
    groups = triton.cdiv(blocks * pieces, SLOTS)
    per_split = triton.cdiv(groups, splits)
    splits = triton.cdiv(groups, per_split)
    out = out if out is not None else torch.empty(splits, rows // PIECE_ROWS, dtype=torch.int32, device=w.device)
    _read_pieces_kernel[(rows // PIECE_ROWS, splits)](w, out, row_bytes, blocks * pieces, per_split, STRIDE=stride,
                                                        SKIP=skip, PIECES=pieces, WIDE=wide, ROWS=PIECE_ROWS)
    return out


def pieces_reference(w: torch.Tensor, type_name: str, packed: bool) -> int:
    """The XOR of the int32 words of every piece read_pieces reads (on the host)."""
    import numpy as np

    stride, skip, pieces = piece_layout(type_name, packed)
    rows, row_bytes = w.shape
    blocks = row_bytes // stride
    starts = (torch.arange(blocks)[:, None] * stride + skip + 16 * torch.arange(pieces)[None, :]).reshape(-1)
    cols = (starts[:, None] + torch.arange(16)[None, :]).reshape(-1)
    words = w.cpu()[:, cols].contiguous().view(torch.int32).reshape(-1).numpy()
    return int(np.bitwise_xor.reduce(words))

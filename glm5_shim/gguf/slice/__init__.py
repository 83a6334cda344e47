"""Random-weight slices of GLM-5 at its real sizes, for memory, speed and loader tests without the 240-800 GB files.

`python -m glm5_shim make-slice OUT.gguf --layers 4 --dense-layers 1 --preset Q4_K_M [--mtp] [--rank-of 8]`:
GLM-5's tensor names, shapes and metadata as llama.cpp's converter writes them, with `layers` layers (the first
`dense_layers` dense) and the MTP block when asked, the per-tensor types of a llama-quantize preset (or
UD-IQ2_M-like), random valid blocks (no float quantization), a tokenizer padded to the vocabulary; --rank-of N: the
model one tensor-parallel rank computes at TP N.

  blocks  random valid GGML blocks at a chosen magnitude, from a byte pool (scale fields from gguf.quants' layouts)
  plan    the slice's config and every tensor's name, shape, type and magnitude, in file order; rank_of; shared_data
          (layers of one kind point at one copy of their bytes: GLM-5's whole depth in a few GB)
  writer  make_slice: the header from the plan, then each tensor streamed; GB/s; write_plain_copy (a shared-data
          slice written plainly, for llama.cpp)
  cli     the make-slice command line
"""

from .blocks import SCALE_FIELDS, SUPPORTED_TYPES, RandomBlocks, calibration
from .cli import add_make_slice_arguments, run_make_slice
from .plan import ORDERS, RANK_DIVIDED, SlicePlan, SliceTensor, plan_slice, rank_config
from .writer import KEY_PREFIX, SliceResult, make_slice, write_plain_copy, write_plan

__all__ = [
    "SCALE_FIELDS", "SUPPORTED_TYPES", "RandomBlocks", "calibration", "add_make_slice_arguments", "run_make_slice",
    "ORDERS", "RANK_DIVIDED", "SlicePlan", "SliceTensor", "plan_slice", "rank_config", "KEY_PREFIX", "SliceResult",
    "make_slice", "write_plain_copy", "write_plan",
]

#!/usr/bin/env python
"""Sparse-MLA attention benchmark at GLM-5 shapes (d_qk 576, d_v 512, top-k 2048) on one CUDA GPU.

    python bench/sparse_mla.py --out DIR [--heads 64,16,8] [--tokens 1,16,64,256,4096] [--pool 262144]
                               [--sweep] [--no-external] [--no-graph]

Columns (µs, median): ours bf16, ours fp8_ds_mla, vLLM's in-tree Triton kernel (xpu_mla_sparse), FlashMLA bf16
sparse prefill (heads zero-padded to 64), FlashMLA fp8 sparse decode, and the floor
``max(bytes / copy bandwidth, flops / bf16 matmul peak)`` with both ceilings measured in this run.

Timing: ``triton.testing.do_bench`` (eager; flushes L2 before every call, so the KV rows come from HBM), the
primary number, as in notes/h200-anchors.md.  With ``--graph`` (default on) our kernels are also timed as a CUDA
graph of many calls that rotate through enough index sets to overflow L2 (what vLLM's decode graphs see, without
Python launch cost).  Before timing, our outputs are checked against the float64 reference on a few tokens.
``--sweep`` additionally times alternative tiles / split counts and prints the best per shape (tuning input for
``_fwd_tiles`` / ``choose_num_splits`` in glm5_shim/kernels/sparse_mla_plan.py).  Results go to DIR/sparse_mla.md
and DIR/sparse_mla.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# --smoke-cpu: run the whole script on CPU through the Triton interpreter with tiny sizes and fp16 (the
# interpreter's bf16 dot is wrong); numbers are meaningless, it only proves the script works end to end.
SMOKE = "--smoke-cpu" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402  (before vLLM, which may swap in a placeholder when it sees no driver)
import triton.testing  # noqa: E402

from glm5_shim.kernels import sparse_mla as sm  # noqa: E402
from glm5_shim.kernels import sparse_mla_reference as ref  # noqa: E402

TOPK = 2048
SCALE = 256 ** -0.5  # GLM-5: qk_head_dim (192 + 64) ** -0.5
BLOCK = 64
CHECK_TOKENS = 4
TOL = {"bf16": 8e-3, "fp8_ds_mla": 8e-3}
DEV = "cpu" if SMOKE else "cuda"
QDT = torch.float16 if SMOKE else torch.bfloat16
OURS_KW = {}  # extra keyword arguments for every call of our kernel (--as-capability)


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------------------------------------ ceilings

def measure_ceilings():
    if SMOKE:
        return 1e12, 1e14
    n = 1 << 28  # 1 GiB of fp32
    x = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    bw = 2 * x.numel() * 4 / (ms * 1e-3)
    x = y = None  # free the buffers (not `del`: the timed lambda closes over them)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
    peak = 2 * 8192 ** 3 / (ms * 1e-3)
    a = b = None
    torch.cuda.empty_cache()
    return bw, peak


# ------------------------------------------------------------------------------------------------ inputs

def make_pool(pool, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    nb = pool // BLOCK
    kv = torch.empty(nb, BLOCK, 576, dtype=QDT, device=DEV)
    kv8 = torch.empty(nb, BLOCK, 656, dtype=torch.uint8, device=DEV)
    step = 256
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        f = torch.randn(b1 - b0, BLOCK, 576, generator=g, device=DEV)
        f[..., :512] *= (torch.rand(b1 - b0, BLOCK, 4, generator=g, device=DEV) * 3 + 0.1).repeat_interleave(128, -1)
        kv[b0:b1] = f.to(QDT)
        kv8[b0:b1] = ref.quantize_fp8_ds_mla(kv[b0:b1].float(), generator=g,
                                             rope_dtype=ref.fp8_ds_mla_rope_dtype(QDT))  # as vLLM writes it
    return kv, kv8


def make_indices(T, pool, g):
    """Distinct random slots per token (top-k of random keys), chunked to bound memory."""
    out = torch.empty(T, TOPK, dtype=torch.int32, device=DEV)
    chunk = max(1, (1 << 28) // (pool * 4))
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        keys = torch.rand(t1 - t0, pool, generator=g, device=DEV)
        out[t0:t1] = keys.topk(TOPK, dim=1).indices.to(torch.int32)
    return out


# ------------------------------------------------------------------------------------------------ externals

def load_externals():
    ext = {}
    try:
        from vllm.v1.attention.ops.xpu_mla_sparse import triton_bf16_mla_sparse_interface
        ext["vllm_triton"] = triton_bf16_mla_sparse_interface
    except Exception as e:  # noqa: BLE001
        log(f"vLLM in-tree Triton kernel unavailable: {type(e).__name__}: {e}")
    try:
        try:
            import vllm.third_party.flashmla.flash_mla_interface  # noqa: F401  (loads the extension)
        except Exception:  # noqa: BLE001
            import vllm._flashmla_C  # noqa: F401
        ops = torch.ops._flashmla_C
        ext["flashmla_bf16"] = ops.sparse_prefill_fwd
        ext["flashmla_fp8"] = ops.sparse_decode_fwd
    except Exception as e:  # noqa: BLE001
        log(f"FlashMLA unavailable: {type(e).__name__}: {e}")
    return ext


def ext_calls(ext, q, kv, kv8, idx):
    T, H, _ = q.shape
    calls = {}
    if "vllm_triton" in ext:
        f = ext["vllm_triton"]
        kv_flat = kv.view(-1, 1, 576)
        idx3 = idx.view(T, 1, TOPK)
        # bind f now: the name is reused below (a late-binding closure called FlashMLA here before)
        calls["vllm_triton"] = lambda f=f, kv_flat=kv_flat, idx3=idx3: f(q, kv_flat, idx3, sm_scale=SCALE)
    if "flashmla_bf16" in ext or "flashmla_fp8" in ext:
        # FlashMLA wants a multiple of 64 heads on Hopper: zero-pad like vLLM does
        qp = q if H % 64 == 0 else torch.nn.functional.pad(q, (0, 0, 0, 64 - H % 64))
        if True:
            if "flashmla_bf16" in ext:
                f = ext["flashmla_bf16"]
                kv_1 = kv.view(-1, 1, 576)
                idx3 = idx.view(T, 1, TOPK)
                calls["flashmla_bf16"] = lambda f=f, kv_1=kv_1, idx3=idx3: f(qp, kv_1, idx3, SCALE, 512,
                                                                              None, None, None)
            if "flashmla_fp8" in ext:
                f8 = ext["flashmla_fp8"]
                q4 = qp.view(T, 1, qp.shape[1], 576)
                kv_4 = kv8.view(torch.float8_e4m3fn).view(kv8.shape[0], BLOCK, 1, 656)
                idx3 = idx.view(T, 1, TOPK)
                calls["flashmla_fp8"] = lambda: f8(q4, kv_4, idx3, None, None, None, None, None, None, None, 512,
                                                   SCALE, None)
    return calls


# ------------------------------------------------------------------------------------------------ timing

def bench_eager(fn, rep=200):
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3


def bench_graph(fns, reps_per_graph=None):
    """Median µs per call of a CUDA graph that runs ``fns`` round-robin (different index sets -> cold L2)."""
    n = len(fns)
    reps = reps_per_graph or max(n, 32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:  # warm up allocator and compile outside the capture
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % n]()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    for _ in range(15):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / reps)
    del g
    times.sort()
    return times[len(times) // 2]


# ------------------------------------------------------------------------------------------------ main

def check(q, kv, idx, kv_format, **kw):
    n = min(CHECK_TOKENS, q.shape[0])
    out, lse = sm.sparse_mla_attention(q[:n], kv, idx[:n], SCALE, kv_format=kv_format, **{**OURS_KW, **kw})
    r_out, r_lse = ref.sparse_mla_reference(q[:n], kv, idx[:n], SCALE, kv_format=kv_format, token_chunk=2)
    err = ((out.double() - r_out).norm() / r_out.norm()).item()
    lerr = (lse.double() - r_lse).abs().max().item()
    return err, lerr


def sweep_tiles(cap, kv_format):
    """A curated set of alternative tiles for --sweep (fit the device's shared memory; a few may spill)."""
    big = cap[0] in (9, 10)
    T = sm.FwdTile
    if kv_format == "fp8_ds_mla":
        # register-prefetch tiles (the pre-SPLIT_LOADS defaults) and Triton-pipelined split-load tiles
        c = [T(16, 64, 8, 1, 1, True), T(16, 32, 8, 1, 1, True), T(32, 32, 8, 1, 1, True), T(16, 16, 4, 1, 2, True),
             T(16, 32, 4, 3, 2), T(16, 32, 8, 5, 1, split_loads=True)]
        if big:
            c += [T(64, 32, 8, 3, 1), T(64, 16, 8, 3, 1), T(32, 32, 8, 3, 1),
                  T(64, 16, 8, 1, 1, True), T(16, 64, 8, 5, 1, split_loads=True)]
    else:
        c = [T(16, 32, 4, 5, 1), T(16, 16, 4, 5, 1), T(16, 32, 8, 5, 1), T(16, 32, 4, 3, 1), T(16, 32, 8, 1, 1, True),
             T(32, 16, 8, 5, 1), T(32, 32, 8, 3, 1), T(32, 32, 8, 1, 1, True)]
        if big:
            c += [T(16, 64, 4, 5, 1), T(32, 32, 8, 5, 1), T(64, 32, 8, 5, 1), T(64, 16, 8, 5, 1), T(64, 32, 8, 3, 1)]
    return c


def tile_name(t):
    return (f"({t.block_h},{t.block_n},w{t.num_warps},s{t.num_stages}"
            f"{',prefetch' if t.prefetch else ''}{',split' if t.split_loads else ''})")


def sweep_shape(a, props, cap, H, T, q, fmt, cache, idx, idx_sets, rec, sweep_rows, decode):
    """Time the alternative tiles (and split counts around the heuristic's) at one shape; log the best."""
    best = None
    for tile in sweep_tiles(cap, fmt):
        n_tiles = triton.cdiv(TOPK, tile.block_n)
        auto = sm.choose_num_splits(T, H, TOPK, props.multi_processor_count, tile.block_h, tile.block_n,
                                    tile.occupancy, 1152 if fmt == "bf16" else 656)
        around = {auto} if T > 4 and not a.sweep_splits else {1, auto, max(1, auto // 2), auto * 2}
        for splits in sorted(around):
            if splits > min(sm.MAX_SPLITS, n_tiles):
                continue
            if T * triton.cdiv(H, tile.block_h) * splits > 64 * props.multi_processor_count:
                continue
            kw = dict(tile=tile, num_splits=splits)
            try:
                err, _ = check(q, cache, idx, fmt, **kw)
                if a.sweep_graph:
                    us = bench_graph([(lambda ix=ix: sm.sparse_mla_attention(q, cache, ix, SCALE, kv_format=fmt,
                                                                          **OURS_KW, **kw))
                                      for ix in idx_sets])
                else:
                    us = bench_eager(lambda: sm.sparse_mla_attention(q, cache, idx, SCALE, kv_format=fmt, **OURS_KW,
                                                                     **kw),
                                     rep=50)
            except Exception as e:  # noqa: BLE001
                log(f"sweep {fmt} H={H} T={T} {tile_name(tile)} S={splits}: {type(e).__name__}: {str(e)[:160]}")
                continue
            srec = dict(heads=H, tokens=T, kv_format=fmt, decode=decode, splits=splits, us=us, relerr=err,
                        graph=bool(a.sweep_graph), **{f"tile_{k}": v for k, v in tile.__dict__.items()})
            sweep_rows.append(srec)
            log(f"sweep {fmt}{'/' + decode if decode else ''} H={H} T={T} {tile_name(tile)} S={splits}: "
                f"{us:.1f} us err {err:.1e}")
            if err <= TOL[fmt] and (best is None or us < best["us"]):
                best = srec
    if best:
        key = ("ours_bf16" if fmt == "bf16" else "ours_fp8") + ("_graph" if a.sweep_graph else "")
        dflt = rec.get(key)
        log(f"SWEEP best {fmt}{'/' + decode if decode else ''} H={H} T={T}: {best['us']:.1f} µs "
            f"(default {dflt and round(dflt, 1)}) "
            f"tile={tile_name(sm.FwdTile(**{k[5:]: v for k, v in best.items() if k.startswith('tile_')}))} "
            f"splits={best['splits']}")


def _capability(text):
    """--as-capability MAJOR.MINOR -> (major, minor); anything else is a one-line usage error."""
    parts = text.split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR such as 12.0 or 8.6, got {text!r}")
    return int(parts[0]), int(parts[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", default="64,16,8")
    ap.add_argument("--tokens", default="1,16,64,256,4096")
    ap.add_argument("--pool", type=int, default=262144)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--no-external", action="store_true")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-tokens", default="1,64,256", help="token counts the sweep covers")
    ap.add_argument("--sweep-graph", action="store_true", help="time the sweep inside CUDA graphs (small T)")
    ap.add_argument("--sweep-formats", default="bf16,fp8_ds_mla", help="cache formats the sweep covers")
    ap.add_argument("--sweep-decodes", default="", help="fp8 decodes the sweep covers (default: the default one)")
    ap.add_argument("--sweep-splits", action="store_true", help="also try split counts around the heuristic's "
                    "above 4 tokens")
    ap.add_argument("--fp8-decodes", default="", help="other fp8 decodes to time (graph), comma-separated; "
                    "default f16ptx,bf16ptx (sm_89+) or f16bits,bf16ptx")
    ap.add_argument("--dtype", default="", choices=["", "bfloat16", "float16"],
                    help="query (and bf16-format cache) dtype; default bfloat16 (float16 in the CPU smoke run). "
                         "float16 is what GGUF serving picks on sm_100+ (sm_120 included)")
    ap.add_argument("--as-capability", default=None, type=_capability,
                    help="pick tiles, splits and fp8 decode as on this compute capability (e.g. 12.0: the sm_120 "
                         "configuration timed on this GPU as a stand-in)")
    ap.add_argument("--smoke-cpu", action="store_true", help="CPU/interpreter dry run of this script (tiny sizes)")
    a = ap.parse_args()
    globals()["TOPK"] = a.topk  # module-level default used by helpers
    if a.dtype:
        globals()["QDT"] = getattr(torch, a.dtype)
    if a.as_capability:
        OURS_KW["capability"] = a.as_capability
    if SMOKE:
        a.no_external, a.no_graph = True, True
    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    heads = [int(x) for x in a.heads.split(",") if x]
    tokens = [int(x) for x in a.tokens.split(",") if x]
    sweep_tokens = {int(x) for x in a.sweep_tokens.split(",") if x}
    sweep_formats = [x for x in a.sweep_formats.split(",") if x]

    if SMOKE:
        class _P:
            name, multi_processor_count, L2_cache_size = "CPU (Triton interpreter)", sm.CPU_DEFAULT_NUM_SMS, 1 << 22
        props, cap = _P(), sm.CPU_DEFAULT_CAPABILITY
    else:
        props = torch.cuda.get_device_properties(0)
        cap = torch.cuda.get_device_capability(0)
    log(f"device: {props.name} sm_{cap[0]}{cap[1]} SMs={props.multi_processor_count} "
        f"L2={props.L2_cache_size >> 20} MiB")
    tcap = OURS_KW.get("capability", cap)  # the capability our kernel's configuration is picked for
    if tcap != cap:
        log(f"our kernel configured as on sm_{tcap[0]}{tcap[1]} (--as-capability)")
    fp8_decode = sm.fp8_decode_method(tcap, QDT, not SMOKE)
    # the other decodes this target can run, timed (graph) for comparison through GLM5_SPARSE_MLA_FP8_DECODE
    alt_decodes = [m for m in (a.fp8_decodes.split(",") if a.fp8_decodes else
                               ["f16ptx", "bf16ptx"] if cap >= (8, 9) else ["f16bits", "bf16ptx"])
                   if m and m != fp8_decode]
    if SMOKE:
        alt_decodes = [m for m in alt_decodes if not m.endswith("ptx")]
    sweep_decodes = [x for x in a.sweep_decodes.split(",") if x] or [fp8_decode]
    log(f"torch {torch.__version__} triton {triton.__version__}; fp8 decode: {fp8_decode}; "
        f"also timed: {alt_decodes}")
    bw, peak = measure_ceilings()
    log(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 matmul {peak / 1e12:.0f} TFLOP/s")

    t0 = time.time()
    kv, kv8 = make_pool(a.pool)
    log(f"KV pool: {a.pool} tokens, bf16 {kv.numel() * 2 / 2**20:.0f} MiB, fp8 {kv8.numel() / 2**20:.0f} MiB "
        f"({time.time() - t0:.1f} s)")
    ext = {} if a.no_external else load_externals()
    g = torch.Generator(device=DEV).manual_seed(1)

    rows, sweep_rows = [], []
    for H in heads:
        for T in tokens:
            rec = {"heads": H, "tokens": T}
            q = (torch.randn(T, H, 576, generator=g, device=DEV) * 0.5).to(QDT)
            per_call = T * TOPK * 1152
            n_sets = 1 if per_call * 3 > props.L2_cache_size else min(64, math.ceil(3 * props.L2_cache_size / per_call))
            idx_sets = [make_indices(T, a.pool, g) for _ in range(n_sets)]
            idx = idx_sets[0]
            for fmt, cache in (("bf16", kv), ("fp8_ds_mla", kv8)):
                key = "ours_bf16" if fmt == "bf16" else "ours_fp8"
                row_bytes = 1152 if fmt == "bf16" else 656
                bytes_ = T * TOPK * row_bytes + T * H * (576 + 512) * 2 + T * TOPK * 4
                flops = 2 * T * H * TOPK * (576 + 512)
                rec[f"floor_{'bf16' if fmt == 'bf16' else 'fp8'}"] = max(bytes_ / bw, flops / peak) * 1e6
                try:
                    err, lerr = check(q, cache, idx, fmt)
                    rec[f"{key}_relerr"] = err
                    rec[f"{key}_lse_err"] = lerr
                    if not (err <= TOL[fmt] and lerr <= 2e-3):
                        log(f"!! H={H} T={T} {fmt}: relative error {err:.2e}, lse error {lerr:.2e} above bounds")
                    rec[key] = bench_eager(lambda: sm.sparse_mla_attention(q, cache, idx, SCALE, kv_format=fmt,
                                                                           **OURS_KW))
                    if not a.no_graph:
                        fns = [(lambda ix=ix: sm.sparse_mla_attention(q, cache, ix, SCALE, kv_format=fmt, **OURS_KW))
                               for ix in idx_sets]
                        rec[f"{key}_graph"] = bench_graph(fns)
                        for m in (alt_decodes if fmt == "fp8_ds_mla" else []):
                            os.environ["GLM5_SPARSE_MLA_FP8_DECODE"] = m
                            try:
                                err_m, _ = check(q, cache, idx, fmt)
                                if err_m > TOL[fmt]:
                                    log(f"!! H={H} T={T} fp8 decode {m}: relative error {err_m:.2e}")
                                rec[f"ours_fp8_graph_{m}"] = bench_graph(fns)
                            finally:
                                os.environ.pop("GLM5_SPARSE_MLA_FP8_DECODE", None)
                except Exception as e:  # noqa: BLE001
                    log(f"!! ours {fmt} H={H} T={T} failed: {type(e).__name__}: {e}")
                    traceback.print_exc()
            for name, fn in ext_calls(ext, q, kv, kv8, idx).items():
                try:
                    fn()
                    torch.cuda.synchronize()
                    rec[name] = bench_eager(fn)
                except Exception as e:  # noqa: BLE001
                    log(f"{name} H={H} T={T}: n/a ({type(e).__name__}: {str(e)[:200]})")
                    torch.cuda.synchronize()
            tile_b = sm.select_fwd_tile(tcap, QDT, "bf16", H, T, TOPK, props.multi_processor_count)
            tile_f = sm.select_fwd_tile(tcap, QDT, "fp8_ds_mla", H, T, TOPK, props.multi_processor_count)
            rec["splits_bf16"] = sm.choose_num_splits(T, H, TOPK, props.multi_processor_count, tile_b.block_h,
                                                      tile_b.block_n, tile_b.occupancy, 1152)
            rec["splits_fp8"] = sm.choose_num_splits(T, H, TOPK, props.multi_processor_count, tile_f.block_h,
                                                     tile_f.block_n, tile_f.occupancy, 656)
            rows.append(rec)
            write_report(out_dir, props, cap, bw, peak, a, rows, sweep_rows, fp8_decode, alt_decodes, final=False)
            log(json.dumps({k: (round(v, 2) if isinstance(v, float) and v > 1e-2 else v) for k, v in rec.items()}))

            if a.sweep and T in sweep_tokens:
                for fmt, cache in (("bf16", kv), ("fp8_ds_mla", kv8)):
                    if fmt not in sweep_formats:
                        continue
                    for decode in (sweep_decodes if fmt == "fp8_ds_mla" else [None]):
                        if decode:
                            os.environ["GLM5_SPARSE_MLA_FP8_DECODE"] = decode
                        try:
                            sweep_shape(a, props, cap, H, T, q, fmt, cache, idx, idx_sets, rec, sweep_rows, decode)
                        finally:
                            os.environ.pop("GLM5_SPARSE_MLA_FP8_DECODE", None)
                write_report(out_dir, props, cap, bw, peak, a, rows, sweep_rows, fp8_decode, alt_decodes,
                             final=False)

    write_report(out_dir, props, cap, bw, peak, a, rows, sweep_rows, fp8_decode, alt_decodes)


def write_report(out_dir, props, cap, bw, peak, a, rows, sweep_rows, fp8_decode, alt_decodes, final=True):
    """sparse_mla.md + sparse_mla.json from the rows so far (written after every row: a run cut short by a time
    limit still leaves its table)."""
    def f(v):
        return "n/a" if v is None else f"{v:.1f}"

    hdr = ("| heads | tokens | floor bf16 | ours bf16 | ours bf16 graph | floor fp8 | ours fp8 | ours fp8 graph "
           f"| ours fp8 graph, {' / '.join(alt_decodes) or '-'} decode | vLLM Triton | FlashMLA bf16 | FlashMLA fp8 "
           "| rel.err bf16 / fp8 | splits bf16 / fp8 |")
    lines = [f"# Sparse MLA on {props.name} (sm_{cap[0]}{cap[1]}, {props.multi_processor_count} SMs)", "",
             f"copy {bw / 1e12:.2f} TB/s, bf16 matmul {peak / 1e12:.0f} TFLOP/s (measured in this run); "
             f"KV pool {a.pool} tokens; top-k {TOPK}; µs = median of triton.testing.do_bench (L2 flushed); "
             f"'graph' = per call inside a CUDA graph rotating index sets; queries {str(QDT)[6:]}; "
             f"fp8 decode {fp8_decode}"
             f"{'; our kernel configured as on sm_%d%d' % OURS_KW['capability'] if 'capability' in OURS_KW else ''}.",
             "", hdr,
             "|" + "---|" * (hdr.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['heads']} | {r['tokens']} | {f(r.get('floor_bf16'))} | {f(r.get('ours_bf16'))} | "
            f"{f(r.get('ours_bf16_graph'))} | {f(r.get('floor_fp8'))} | {f(r.get('ours_fp8'))} | "
            f"{f(r.get('ours_fp8_graph'))} | "
            f"{' / '.join(f(r.get('ours_fp8_graph_' + m)) for m in alt_decodes) or '-'} | "
            f"{f(r.get('vllm_triton'))} | {f(r.get('flashmla_bf16'))} | "
            f"{f(r.get('flashmla_fp8'))} | {r.get('ours_bf16_relerr', float('nan')):.1e} / "
            f"{r.get('ours_fp8_relerr', float('nan')):.1e} | {r['splits_bf16']} / {r['splits_fp8']} |")
    md = "\n".join(lines) + "\n"
    (out_dir / "sparse_mla.md").write_text(md)
    meta = dict(device=props.name, capability=list(cap), sms=props.multi_processor_count, copy_bw=bw,
                bf16_peak=peak, pool=a.pool, topk=TOPK, torch=torch.__version__, triton=triton.__version__,
                fp8_decode=fp8_decode, fp8_decodes_compared=alt_decodes, complete=final)
    (out_dir / "sparse_mla.json").write_text(json.dumps(dict(meta=meta, rows=rows, sweep=sweep_rows), indent=1))
    if final:
        print(md)
        log(f"wrote {out_dir / 'sparse_mla.md'} and {out_dir / 'sparse_mla.json'}")


if __name__ == "__main__":
    main()

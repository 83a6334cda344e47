"""Benchmark the Triton indexer logits against DeepGEMM and the bandwidth floor (standalone, one GPU).

    python bench/indexer.py --out DIR [--quick] [--sweep] [--manual]

Decode: batch 1/32/128 x context 4k/32k/128k, 32 heads, next_n 1, block size 64, random block tables,
max_model_len = context.  Prefill: 4k and 16k tokens, one causal request (ks = 0, ke = row + 1).
Times are medians of ``triton.testing.do_bench``.  Every shim output (and DeepGEMM's) is checked against the
float64 reference on sampled rows before it is timed.

floor (decode) = rows x context x 132 B / copy bandwidth measured in this run (bytes read + written per second of a
device-to-device copy, as in notes/h200-anchors.md).  Targets: decode <= 1.5x DeepGEMM and >= 60% of the floor from
32k context on; prefill <= 2x DeepGEMM.

--sweep   also times alternative launch parameters (decode CTAs per SM / pipeline stages, prefill tiles) so the
          defaults in ``glm5_shim/kernels/indexer_logits.py`` can be retuned from the output.
--manual  also times the sm_80/86 byte-decoding path (native=False) on this GPU, for information.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import triton  # noqa: E402  (the real one: this script needs a GPU)
import triton.testing  # noqa: E402

from glm5_shim.kernels import indexer_logits as il  # noqa: E402
from glm5_shim.kernels import indexer_logits_reference as ref  # noqa: E402

PAGE = 64
HEADS = 32
CHECK_RTOL = 2e-3  # of sum_h |w| sum_d |q k| s, as in tests/gpu/test_indexer_gpu.py


def us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1000.0


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 2 GiB device-to-device copy."""
    n = 1 << 31
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = us(lambda: dst.copy_(src))
    src = dst = None  # free the buffers (not `del`: the timed lambda closes over them)
    torch.cuda.empty_cache()
    return 2 * n / (t * 1e-6)


def deep_gemm():
    try:
        import vllm.utils.deep_gemm as dg
        from vllm.utils.import_utils import has_deep_gemm

        if not has_deep_gemm():
            return None, "vLLM reports no DeepGEMM"
        return dg, ""
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------------------------
# inputs (built on the GPU; random e4m3 bytes without the NaN pattern, power-of-two scales)
# ---------------------------------------------------------------------------------------------------------------


def random_e4m3_bytes(shape, g):
    b = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda", generator=g)
    return torch.where((b & 0x7F) == 0x7F, b ^ 0x01, b)  # 0x7f/0xff are NaN in e4m3fn


def random_qw(rows, heads, g):
    q = random_e4m3_bytes((rows, heads, 128), g).view(torch.float8_e4m3fn)
    # |e4m3| goes up to 448: keep the logits O(1) the way folded q scales do
    w = torch.randn(rows, heads, device="cuda", generator=g) * 2.0 ** -16
    return q, w


def paged_cache(batch, context, g):
    nblk = batch * math.ceil(context / PAGE)
    cache = random_e4m3_bytes((nblk, PAGE * 132), g)
    exps = torch.randint(-12, -4, (nblk, PAGE), device="cuda", generator=g).float()
    cache[:, PAGE * 128:] = torch.pow(2.0, exps).contiguous().view(torch.uint8).view(nblk, PAGE * 4)
    perm = torch.randperm(nblk, device="cuda", generator=g).to(torch.int32)
    bt = perm.view(batch, -1).contiguous()
    return cache.view(nblk, PAGE, 1, 132), bt


def check_rows(out, want, bound, what):
    valid = torch.isfinite(want)
    err = ((out.double() - want).abs()[valid] / (CHECK_RTOL * bound[valid] + 1e-30)).max().item()
    if not err <= 1.0:
        raise SystemExit(f"{what}: wrong result (max error / tolerance {err:.3g}); not timing it")
    return err


# ---------------------------------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------------------------------


def bench_decode(batch, context, bw, dg, sms, args, g):
    cache, bt = paged_cache(batch, context, g)
    q, w = random_qw(batch, HEADS, g)
    q = q.view(batch, 1, HEADS, 128)
    cl = torch.full((batch, 1), context, dtype=torch.int32, device="cuda")
    mml = context
    rows = sorted({0, batch - 1})
    want, bound = ref.paged_mqa_logits_reference(q, cache, w, cl, bt, mml, with_bound=True, rows=rows)
    want, bound = want[rows], bound[rows]

    rec = {"kind": "decode", "batch": batch, "context": context, "bytes": batch * context * 132}
    rec["floor_us"] = rec["bytes"] / bw * 1e6
    out = il.paged_mqa_logits((q, None), cache, w, cl, bt, None, mml, False)
    rec["check"] = check_rows(out[rows], want, bound, f"shim decode {batch}x{context}")
    rec["shim_us"] = us(lambda: il.paged_mqa_logits((q, None), cache, w, cl, bt, None, mml, False))
    if args.manual:
        out = il.paged_mqa_logits_impl((q, None), cache, w, cl, bt, None, mml, False, native=False)
        check_rows(out[rows], want, bound, "manual decode")
        rec["manual_us"] = us(lambda: il.paged_mqa_logits_impl((q, None), cache, w, cl, bt, None, mml, False,
                                                               native=False))
    if args.sweep:
        rec["sweep"] = {}
        for ctas in (2, 4, 6, 8, 12):
            for stages in (5, 7, 9):
                kw = dict(num_programs=ctas * sms, num_stages=stages)
                out = il.paged_mqa_logits_impl((q, None), cache, w, cl, bt, None, mml, False, **kw)
                check_rows(out[rows], want, bound, f"sweep {kw}")
                rec["sweep"][f"ctas{ctas}_st{stages}"] = us(
                    lambda: il.paged_mqa_logits_impl((q, None), cache, w, cl, bt, None, mml, False, **kw))
    rec["deepgemm_us"] = None
    if dg is not None:
        try:
            meta = dg.get_paged_mqa_logits_metadata(cl, PAGE, sms)
            out = dg.fp8_fp4_paged_mqa_logits((q, None), cache, w, cl, bt, meta, mml, False)
            rec["deepgemm_check"] = check_rows(out[rows], want, bound, "DeepGEMM decode")
            rec["deepgemm_us"] = us(lambda: dg.fp8_fp4_paged_mqa_logits((q, None), cache, w, cl, bt, meta, mml, False))
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001
            rec["deepgemm_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    cache = bt = out = None  # free the buffers (not `del`: timed lambdas close over them)
    torch.cuda.empty_cache()
    return rec


def bench_prefill(tokens, dg, args, g):
    q, w = random_qw(tokens, HEADS, g)
    k = random_e4m3_bytes((tokens, 128), g).view(torch.float8_e4m3fn)
    ksc = torch.pow(2.0, torch.randint(-12, -4, (tokens,), device="cuda", generator=g).float())
    ks = torch.zeros(tokens, dtype=torch.int32, device="cuda")
    ke = torch.arange(1, tokens + 1, dtype=torch.int32, device="cuda")
    rows = torch.cat([torch.arange(0, tokens, max(1, tokens // 61), device="cuda"),
                      torch.tensor([tokens - 1], device="cuda")])
    want, bound = ref.mqa_logits_reference(q[rows], k, ksc, w[rows], ks[rows], ke[rows], with_bound=True)

    flops = 2 * 128 * HEADS * int((ke - ks).sum())
    rec = {"kind": "prefill", "tokens": tokens, "flops": flops}
    out = il.mqa_logits((q, None), (k, ksc), w, ks, ke, False)
    rec["check"] = check_rows(out[rows], want, bound, f"shim prefill {tokens}")
    rec["shim_us"] = us(lambda: il.mqa_logits((q, None), (k, ksc), w, ks, ke, False))
    if args.manual:
        out = il.mqa_logits_impl((q, None), (k, ksc), w, ks, ke, False, native=False)
        check_rows(out[rows], want, bound, "manual prefill")
        rec["manual_us"] = us(lambda: il.mqa_logits_impl((q, None), (k, ksc), w, ks, ke, False, native=False))
    if args.sweep:
        rec["sweep"] = {}
        for tile in ((64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4), (64, 8, 3)):
            out = il.mqa_logits_impl((q, None), (k, ksc), w, ks, ke, False, tile=tile)
            check_rows(out[rows], want, bound, f"sweep {tile}")
            rec["sweep"][f"bn{tile[0]}_w{tile[1]}_st{tile[2]}"] = us(
                lambda: il.mqa_logits_impl((q, None), (k, ksc), w, ks, ke, False, tile=tile))
    rec["deepgemm_us"] = None
    if dg is not None:
        try:
            out = dg.fp8_fp4_mqa_logits((q, None), (k, ksc), w, ks, ke, clean_logits=False)
            rec["deepgemm_check"] = check_rows(out[rows], want, bound, "DeepGEMM prefill")
            rec["deepgemm_us"] = us(lambda: dg.fp8_fp4_mqa_logits((q, None), (k, ksc), w, ks, ke, clean_logits=False))
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001
            rec["deepgemm_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del out
    torch.cuda.empty_cache()
    return rec


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="batch 1/32 x context 4k/32k and prefill 4k only")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--manual", action="store_true")
    args = ap.parse_args()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(int(time.time()))
    bw = copy_bandwidth()
    dg, dg_why = deep_gemm()
    info = {"device": props.name, "capability": f"{props.major}.{props.minor}", "sms": sms,
            "copy_bw_TBps": bw / 1e12, "torch": torch.__version__, "triton": triton.__version__,
            "deepgemm": "available" if dg is not None else f"n/a ({dg_why})",
            "native_fp8": il.native_fp8_supported((props.major, props.minor))}
    print(json.dumps(info), flush=True)

    batches, contexts, prefills = ((1, 32), (4096, 32768), (4096,)) if args.quick else \
        ((1, 32, 128), (4096, 32768, 131072), (4096, 16384))
    recs = []
    for b in batches:
        for c in contexts:
            recs.append(bench_decode(b, c, bw, dg, sms, args, g))
            print(json.dumps(recs[-1]), flush=True)
    for t in prefills:
        recs.append(bench_prefill(t, dg, args, g))
        print(json.dumps(recs[-1]), flush=True)

    lines = [f"# Indexer logits: {props.name} (sm_{props.major}{props.minor}, {sms} SMs), copy bandwidth "
             f"{bw / 1e12:.2f} TB/s, DeepGEMM {info['deepgemm']}", ""]
    lines += [f"Decode grid (CTAs, from occupancy): {sorted(set(il._DECODE_GRID.values()))}", ""]
    lines += ["| decode batch | context | floor µs | shim µs | DeepGEMM µs | shim / DG | % of floor | targets |",
              "|---|---|---|---|---|---|---|---|"]
    ok_all = True
    for r in recs:
        if r["kind"] != "decode":
            continue
        ratio = r["shim_us"] / r["deepgemm_us"] if r["deepgemm_us"] else None
        pct = 100.0 * r["floor_us"] / r["shim_us"]
        verdict = []
        verdict.append("DG n/a" if ratio is None else ("<=1.5x DG" if ratio <= 1.5 else "MISS 1.5x DG"))
        if r["context"] >= 32768:
            verdict.append(">=60% floor" if pct >= 60.0 else "MISS 60% floor")
        ok = not any(v.startswith("MISS") for v in verdict)
        ok_all &= ok
        r["meets_targets"] = ok
        lines.append(f"| {r['batch']} | {r['context']} | {r['floor_us']:.1f} | {r['shim_us']:.1f} | "
                     f"{fmt(r['deepgemm_us'])} | {fmt(ratio, '.2f')} | {pct:.0f}% | {', '.join(verdict)} |")
    lines += ["", "| prefill tokens (causal) | shim µs | shim TFLOP/s | DeepGEMM µs | DG TFLOP/s | shim / DG "
              "| targets |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        if r["kind"] != "prefill":
            continue
        ratio = r["shim_us"] / r["deepgemm_us"] if r["deepgemm_us"] else None
        ok = ratio is None or ratio <= 2.0
        ok_all &= ok
        r["meets_targets"] = ok
        verdict = "DG n/a" if ratio is None else ("<=2x DG" if ok else "MISS 2x DG")
        tf = r["flops"] / r["shim_us"] / 1e6
        dtf = r["flops"] / r["deepgemm_us"] / 1e6 if r["deepgemm_us"] else None
        lines.append(f"| {r['tokens']} | {r['shim_us']:.1f} | {tf:.0f} | {fmt(r['deepgemm_us'])} | {fmt(dtf, '.0f')} | "
                     f"{fmt(ratio, '.2f')} | {verdict} |")
    if args.manual:
        lines += ["", "sm_80/86 byte-decoding path on this GPU (µs): " + ", ".join(
            f"{r['kind']} {r.get('batch', '')}{'x' if r['kind'] == 'decode' else ''}"
            f"{r.get('context', r.get('tokens'))}: {r['manual_us']:.1f}" for r in recs)]
    if args.sweep:
        lines += ["", "## Sweep (µs)", ""]
        for r in recs:
            best = min(r["sweep"], key=r["sweep"].get)
            name = f"decode {r['batch']}x{r['context']}" if r["kind"] == "decode" else f"prefill {r['tokens']}"
            lines.append(f"- {name}: default {r['shim_us']:.1f}; best {best} {r['sweep'][best]:.1f}; " +
                         ", ".join(f"{k} {v:.1f}" for k, v in r["sweep"].items()))
    errors = sorted({r["deepgemm_error"] for r in recs if "deepgemm_error" in r})
    if errors:
        lines += ["", "DeepGEMM calls failed: " + "; ".join(errors)]
    lines += ["", f"All measured targets met: {'yes' if ok_all else 'NO'}"
              f"{'' if all(r['deepgemm_us'] for r in recs) else ' (DeepGEMM comparisons missing)'}"]
    table = "\n".join(lines)
    print("\n" + table)
    (out_dir / "indexer_bench.md").write_text(table + "\n")
    info["decode_grid"] = {str(k): v for k, v in il._DECODE_GRID.items()}  # resolved CTAs (per config) x SMs
    (out_dir / "indexer_bench.json").write_text(json.dumps({"info": info, "results": recs}, indent=1))


if __name__ == "__main__":
    main()

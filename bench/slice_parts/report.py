"""DIR/slice.md: the tables of DIR/slice.json."""
from __future__ import annotations

from .kernels import CATEGORIES, LABELS


def _v(x, fmt="{}"):
    return "-" if x is None else fmt.format(x)


def _spec(spec: dict | None) -> str:
    if not spec:
        return "-"
    acc = spec.get("acceptance")
    return f"{spec.get('k')}: {'-' if acc is None else f'{acc:.2f}'}"


def report(results: dict) -> str:
    s = results.get("serve", {})
    lines = [f"# GLM-5 slices served — {results.get('date', '')} — {results.get('gpu', '')}", "",
             f"Command: `{results.get('command', '')}`", "",
             f"Serving: `--max-model-len {s.get('max_model_len')} --gpu-memory-utilization "
             f"{s.get('gpu_memory_utilization')} --max-num-seqs {s.get('max_num_seqs')} --max-num-batched-tokens "
             f"{s.get('max_num_batched_tokens')} --no-enable-prefix-caching`, KV cache dtype auto, CUDA graphs (vLLM's "
             f"default), TP 1, one server at a time; decode streams generate {s.get('out_len')} tokens "
             "(ignore_eos).", ""]
    slices = results.get("slices", {})
    if slices:
        lines += ["## Slices (make-slice on the device)", "", "| slice | preset | rank of | GB | written s | GB/s |",
                  "|---|---|---|---|---|---|"]
        for name, sl in slices.items():
            gb = round(sl["bytes"] / 1e9, 2) if sl.get("bytes") else None
            lines.append(f"| {name} | {sl.get('preset')} | {sl.get('rank_of')} | {_v(gb)} | {_v(sl.get('seconds'))}"
                         f"{' (reused)' if sl.get('reused') else ''} | {_v(sl.get('gb_per_s'))} |")
        lines.append("")
    parts = results.get("parts", {})
    lines += ["## Start-up and memory", "",
              "| part | ok | start-up s (to /health) | load s | load GB/s | init engine s (compile s) | weights GiB "
              "| KV GiB (tokens) | CUDA graphs GiB (s) | GPU used GiB (other) | host RSS peak GiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, p in parts.items():
        st = p.get("startup")
        if not st:
            lines.append(f"| {key} | {p.get('skipped') or p.get('error', '-')[:80]} |" + " - |" * 9)
            continue
        lines.append(f"| {key} | {st.get('ok')} | {_v(st.get('startup_s'))} | {_v(st.get('load_s'))} | "
                     f"{_v(st.get('load_gb_s'))} | {_v(st.get('init_engine_s'))} ({_v(st.get('compile_s'))}) | "
                     f"{_v(st.get('weights_gib'))} | {_v(st.get('available_kv_gib'))} "
                     f"({_v(st.get('kv_tokens'), '{:,.0f}')}) | "
                     f"{_v(st.get('graphs_gib'))} ({_v(st.get('graphs_s'))}) | {_v(st.get('gpu_used_gib'))} "
                     f"({_v(st.get('gpu_other_gib'))}) | {_v(p.get('host_rss_peak_gib'))} |")
    lines += ["", "Parts: " + "; ".join(f"**{k}** {p.get('title')}" for k, p in parts.items()), ""]
    rows = [(k, r) for k, p in parts.items() for r in p.get("decode", [])]
    if rows:
        lines += ["## Decode (steady window: every stream decoding) and time to first token", "",
                  "| part | prompt | concurrency | decode output tok/s | per stream tok/s (TPOT ms) "
                  "| TTFT ms median / max | window s | errors | MTP K: acceptance |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for k, r in rows:
            lines.append(f"| {k} | {r['in_len']} | {r['concurrency']} | {_v(r.get('decode_tok_s'))} | "
                         f"{_v(r.get('per_stream_tok_s'))} ({_v(r.get('tpot_ms'))}) | {_v(r.get('ttft_ms_median'))} / "
                         f"{_v(r.get('ttft_ms_max'))} | {_v(r.get('window_s'))} | {r.get('errors')} | "
                         f"{_spec(r.get('spec'))} |")
        lines.append("")
    pre = [(k, p["prefill"]) for k, p in parts.items() if p.get("prefill")]
    if pre:
        lines += ["## Prefill (max_tokens=1, no prefix cache)", "",
                  "| part | prompt | requests (concurrency) | prefill tok/s | TTFT ms median | errors |",
                  "|---|---|---|---|---|---|"]
        for k, r in pre:
            lines.append(f"| {k} | {r['in_len']} | {r['requests']} ({r['concurrency']}) | {r['prefill_tok_s']} | "
                         f"{_v(r.get('ttft_ms_median'))} | {r['errors']} |")
        lines.append("")
    agree = results.get("logprob_agreement")
    if agree and "rows" not in agree:
        lines += ["## First-token log-probabilities, shim-forced (a) vs native (b)", "",
                  f"Not compared: {agree.get('error', '?')}.", ""]
    elif agree:
        lines += ["## First-token log-probabilities, shim-forced (a) vs native (b), same slice and prompts", "",
                  f"Same top-1: {agree['same_top1']} of {agree['of']}; max |Δ logprob| of the top-1 token "
                  f"{_v(agree.get('max_top1_dlogprob'))}; max over the top-5 tokens both list "
                  f"{_v(agree.get('max_dlogprob_common'))}; errors {agree.get('errors', 0)}. Reference (a): "
                  f"{agree.get('reference', 'part a of this run')}"
                  f"{'' if agree.get('prompts_checked') else ' (prompts matched by length only)'}. "
                  "Both arms load the GGUF through the shim and run the same "
                  "GGUF matmul kernels: the difference is the attention and indexer path (random-weight slice: "
                  "near ties, a small top-2 gap, can flip the top-1 token).", "",
                  "| prompt tokens | same top-1 | |Δ lp| top-1 | max |Δ lp| common | common of 5 | top-2 gap (shim) |",
                  "|---|---|---|---|---|---|"]
        for r in agree["rows"]:
            if "error" in r:
                lines.append(f"| error: {r['error'][:100]} | | | | | |")
                continue
            lines.append(f"| {r['prompt_tokens']} | {r['same_top1']} | {_v(r['top1_dlogprob'])} | "
                         f"{_v(r['max_dlogprob_common'])} | {r['common_of_5']} | {_v(r['top2_gap'])} |")
        lines.append("")
    profs = [(k, name, pr) for k, p in parts.items() for name, pr in p.get("profile", {}).items()]
    if profs:
        lines += ["## Kernel time per engine step (torch profiler; µs a step, all layers of the slice)", "",
                  "| part | window | steps | " + " | ".join(LABELS[c] for c in CATEGORIES) + " | sum | note |",
                  "|---|---|---|" + "---|" * (len(CATEGORIES) + 2)]
        for k, name, pr in profs:
            per = pr.get("per_step_us") or {}
            total = round(sum(per.values()), 1) if per else None
            note = pr.get("error") or pr.get("warning") or ""
            lines.append(f"| {k} | {name} | {pr.get('steps', '-')} | " + " | ".join(_v(per.get(c)) for c in CATEGORIES)
                         + f" | {_v(total)} | {note[:80]} |")
        lines += ["", "Largest kernel of each group (name, µs in the window, calls; six a group in slice.json), and "
                  "\"other\" by kind:", ""]
        for k, name, pr in profs:
            tops = "; ".join(f"{LABELS.get(cat, cat)} `{top[0][0][:60]}` {top[0][1]} ({top[0][2]})"
                             for cat, top in (pr.get("top") or {}).items() if top)
            kinds = ", ".join(f"{kind} {us} µs" for kind, us in (pr.get("other_kinds") or {}).items())
            lines.append(f"- {k} {name}: {tops or '-'}" + (f"; other by kind: {kinds}" if kinds else ""))
        lines.append("")
        lines += per_layer_table(results, profs)
    for key, p in parts.items():
        st = p.get("startup") or {}
        if st.get("lines") or p.get("error") or p.get("skipped_steps"):
            lines += [f"### Part {key}: server log lines", ""] + [f"    {x}" for x in st.get("lines", [])]
            if p.get("skipped_steps"):
                lines.append(f"    (skipped for time: {', '.join(p['skipped_steps'])})")
            if p.get("error"):
                lines += ["", "    " + p["error"][-800:].replace("\n", "\n    ")]
            lines.append("")
    return "\n".join(lines) + "\n"


def per_layer_table(results: dict, profs: list) -> list[str]:
    """Decode windows per decoder layer: µs and launches a layer by group (the step's totals over the slice's layers;
    lm_head, embedding and sampling included in the step, so a layer's share is an upper bound), and the GPU's share
    of the step (kernel time a step over the TPOT the decode step measured at that concurrency: the rest is the host
    and launch gaps)."""
    rows = []
    for k, name, pr in profs:
        if not name.startswith("decode") or not pr.get("steps"):
            continue
        part = results["parts"][k]
        layers = (results.get("slices", {}).get(part.get("slice"), {}) or {}).get("layers")
        if not layers:
            continue
        steps = pr["steps"]
        per = pr.get("per_step_us") or {}
        total = sum(per.values())
        counts = pr.get("count") or {}
        c = pr.get("concurrency")
        tpot = next((r.get("tpot_ms") for r in part.get("decode", []) if r.get("concurrency") == c), None)
        gpu_share = f"{100 * total / (tpot * 1e3):.0f} %" if tpot else "-"
        rows.append(f"| {k} | {name} | {layers} | {total / layers:.1f} | "
                    + " | ".join(f"{per.get(cat, 0) / layers:.1f}" for cat in CATEGORIES)
                    + f" | {pr.get('kernels', 0) / steps / layers:.1f} | "
                    + " / ".join(f"{counts.get(cat, 0) / steps / layers:.1f}" for cat in CATEGORIES)
                    + f" | {total / 1e3:.2f} | {_v(tpot)} | {gpu_share} |")
    if not rows:
        return []
    return ["## Per decoder layer, decode (the step over the slice's layers)", "",
            "| part | window | layers | µs a layer | " + " | ".join(LABELS[c] for c in CATEGORIES)
            + " | launches a layer | launches by group (" + " / ".join(LABELS[c] for c in CATEGORIES)
            + ") | kernel ms a step | TPOT ms | GPU share of the step |",
            "|---|---|---|---|" + "---|" * len(CATEGORIES) + "---|---|---|---|---|", *rows, ""]

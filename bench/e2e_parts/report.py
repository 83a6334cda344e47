"""The markdown report (DIR/e2e.md) of a run's summarized results."""
from __future__ import annotations

from .arms import GEN_TOKENS


def report(results: dict) -> str:
    lines = [f"# End to end — {results.get('date', '')} — {results.get('gpu', '')}, "
             f"tensor parallel {results.get('tp')}",
             "", f"Command: `{results.get('command', '')}`", ""]
    lines += ["## Servers", "", "| arm | model | KV cache | attention / indexer | start-up s | checks |",
              "|---|---|---|---|---|---|"]
    for name, res in results["arms"].items():
        checks = res.get("functional", {}).get("checks", {})
        ok = ("all pass" if checks and all(checks.values())
              else ", ".join(k for k, v in checks.items() if not v) or res.get("error", "-"))
        lines.append(f"| {name} | {res.get('quant')} | {res.get('kv')} | {res.get('backends', '-')} | "
                     f"{res.get('startup_s', '-')} | {ok} |")
    lines += ["", "## Greedy agreement, shim-forced vs native (identical greedy tokens of "
              f"{GEN_TOKENS}; |Δ log-prob| of the chosen token over the identical prefix)", ""]
    for tag, rows in results.get("agreement", {}).items():
        lines += [f"### {tag}", "",
                  "| prompt | prompt tokens | identical | max |Δ lp| | median |Δ lp| | top-2 gap where they part |",
                  "|---|---|---|---|---|---|"]
        for pname, r in rows.items():
            lines.append(f"| {pname} | {r['prompt_tokens']} | {r['identical']}/{r['of']} | {r['max_abs_dlogprob']} | "
                         f"{r['median_abs_dlogprob']} | "
                         f"{r.get('gap_at_divergence') if r.get('gap_at_divergence') is not None else '-'} |")
        lines.append("")
    if results.get("reference_error"):
        lines += ["## Float32 reference: failed", "", "```", results["reference_error"][-800:], "```", ""]
    reps = {n: r["repeatability"] for n, r in results["arms"].items() if "repeatability" in r}
    if reps:
        lines += ["## Repeatability (the same greedy request 4 times, each with its own cache_salt)", "",
                  "| arm | prompt | different answers | first divergence (token, top-2 gap) |", "|---|---|---|---|"]
        for n, r in reps.items():
            for pname, v in r.items():
                w = v.get("worst") or {}
                where = ("-" if w.get("same") and w.get("identical") == w.get("of")
                         else f"{w.get('identical')}, {w.get('gap_at_divergence')}")
                lines.append(f"| {n} | {pname} | {v['distinct_answers']} of {v['runs']} | {where} |")
        lines.append("")
    if results.get("reference_summary"):
        lines += ["## Against the float32 reference (transformers GlmMoeDsaForCausalLM on the GGUF's dequantized "
                  "weights, teacher-forced on each arm's own tokens)", "",
                  "| arm | decode |Δ lp| mean / median / p99 / max, # > 0.25 of n "
                  "| prefill |Δ lp| mean / median / p99 / max, # > 0.25 of n | greedy = reference top-1 |",
                  "|---|---|---|---|"]
        for arm, s in results["reference_summary"].items():
            d, p = s["decode"], s["prefill"]
            lines.append(f"| {arm} | {d['mean']} / {d['median']} / {d['p99']} / {d['max']}, "
                         f"{d['over_0.25']} of {d['n']} | "
                         f"{p['mean']} / {p['median']} / {p['p99']} / {p['max']}, {p['over_0.25']} of {p['n']} | "
                         f"{s['top1_agree']}/{s['positions']} |")
        lines.append("")
    tp_rows = [(n, r) for n, res in results["arms"].items() for r in res.get("throughput", [])]
    if tp_rows:
        lines += ["## Throughput (streaming completions, greedy, ignore_eos)", "",
                  "| arm | concurrency | requests | in / out tokens | output tok/s | prompt tok/s "
                  "| TTFT ms median / p99 | TPOT ms median / p99 | errors |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for n, r in tp_rows:
            lines.append(f"| {n} (pass {r.get('pass', 1)}) | {r['concurrency']} | {r['requests']} | "
                         f"{r['in_len']} / {r['out_len']} | {r['output_tok_s']} | {r.get('input_tok_s', '-')} | "
                         f"{r['ttft_ms_median']} / {r['ttft_ms_p99']} | {r['tpot_ms_median']} / {r['tpot_ms_p99']} | "
                         f"{r['errors']} |")
        lines += ["", "shim / native output tokens/s (mean over passes 2..N where there are several): " + "; ".join(
            f"{tag}: " + ", ".join(f"c={c} {v}×" for c, v in r.items())
            for tag, r in results.get("throughput_ratio", {}).items()), ""]
    for name, res in results["arms"].items():
        if "load" in res:
            ld = res["load"]
            lines += [f"## Load on {name}", "",
                      f"{ld['clients']} concurrent streaming clients for {ld['seconds']} s, prompts 200–2000 tokens "
                      f"(index_topk 128), 16/64/128 output tokens: sent {ld['sent']}, completed {ld['completed']}, "
                      f"lost {ld['lost']}, errors {ld['errors_count']}, short {ld['short']}, "
                      f"output tokens {ld['tokens']}; "
                      f"after the load the same greedy requests give the same answers as before: "
                      f"{res.get('after_load_same_tokens')} "
                      f"({res.get('after_load')})", ""]
        if "bad_requests" in res:
            lines += [f"## Bad requests on {name}", "", "| request | HTTP status | message | server alive after |",
                      "|---|---|---|---|"]
            for k, v in res["bad_requests"].items():
                if isinstance(v, dict) and "status" in v:
                    lines.append(f"| {k} | {v['status']} | {v['message'][:90].replace('|', '/')} | "
                                 f"{v['alive_after']} |")
            lines += ["", "next good request gives the same answer as before: "
                          f"{res['bad_requests'].get('next_request')}", ""]
    return "\n".join(lines) + "\n"

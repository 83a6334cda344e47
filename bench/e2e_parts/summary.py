"""Summaries of a run's results: quantiles, shim-vs-native greedy agreement, reference scores per arm, throughput
ratios."""
from __future__ import annotations

import statistics

from .functional import common_prefix, top2_gap


def percentile99(sorted_xs: list[float]) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(0.99 * len(sorted_xs)))]


def quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"median": None, "mean": None, "p99": None, "max": None, "over_0.25": 0, "n": 0}
    s = sorted(xs)
    return {"median": round(statistics.median(s), 4), "mean": round(statistics.fmean(s), 4),
            "p99": round(percentile99(s), 4), "max": round(s[-1], 4),
            "over_0.25": sum(x > 0.25 for x in s), "n": len(s)}


def greedy_agreement(a: dict, b: dict) -> dict:
    """Per prompt: identical greedy prefix length and |Δ log-prob| of the chosen token over that prefix."""
    rows = {}
    for name in a:
        ia, ib = a[name]["ids"], b[name]["ids"]
        n = common_prefix(ia, ib)
        diffs = [abs(x - y) for x, y in zip(a[name]["logprobs"][:n], b[name]["logprobs"][:n])]
        gap = None
        if n < min(len(ia), len(ib)) and "top" in a[name] and "top" in b[name]:
            gap = round(min(top2_gap(a[name]["top"][n]), top2_gap(b[name]["top"][n])), 4)
        rows[name] = {"prompt_tokens": len(a[name]["prompt_ids"]), "identical": n, "of": len(ia),
                      "max_abs_dlogprob": round(max(diffs), 4) if diffs else None,
                      "median_abs_dlogprob": round(statistics.median(diffs), 4) if diffs else None,
                      "gap_at_divergence": gap}
    return rows


def shim_native_pairs(names) -> list[tuple[str, str, str]]:
    """(tag, shim arm, native arm) for every tag both paths have among `names`: shim-q80-bf16 ↔ native-q80-bf16."""
    names = set(names)
    return [(n[len("shim-"):], n, "native-" + n[len("shim-"):]) for n in sorted(names)
            if n.startswith("shim-") and "native-" + n[len("shim-"):] in names]


def summarize(results: dict) -> None:
    arms = results["arms"]
    served = [n for n, res in arms.items() if "functional" in res]
    results["agreement"] = {tag: greedy_agreement(arms[s]["functional"]["greedy"], arms[n]["functional"]["greedy"])
                            for tag, s, n in shim_native_pairs(served)}
    ref = results.get("reference", {})
    results["reference_summary"] = {
        arm: {"decode": quantiles([d for p in per.values() for d in p["decode_abs_diff"]]),
              "prefill": quantiles([d for p in per.values() for d in p["prefill_abs_diff"]]),
              "top1_agree": sum(p["top1_agree"] for p in per.values()),
              "positions": sum(p["positions"] for p in per.values())}
        for arm, per in ref.items()}
    # output tokens/s per arm and shape: the mean over the warm passes (2..N; the first pass of a fresh machine pays
    # Triton's first-use compiles), or the only pass there is
    tp: dict = {}
    for name, res in arms.items():
        by_key: dict = {}
        for row in res.get("throughput", []):
            key = row["concurrency"] if row.get("pass") != "split" else f"32 ({row['in_len']}/{row['out_len']})"
            by_key.setdefault(key, []).append(row)
        for key, rows in by_key.items():
            warm = [r for r in rows if r.get("pass") not in (1, None)] or rows
            tp.setdefault(name, {})[key] = statistics.fmean(r["output_tok_s"] for r in warm)
    results["throughput_ratio"] = {tag: {c: round(tp[s][c] / tp[n][c], 3) for c in tp[s] if tp[n].get(c)}
                                   for tag, s, n in shim_native_pairs(tp)}

"""Does a real request meet issue 41's bars? Reads the JSON of `elastic-attention bench request` and prints, per
bar, the measured values and met / missed:

- robust prompts at 32K: time to first token >= 1.4x faster than the best dense setup of the same run (each batch);
- robust prompts at batch 8: decode tokens/s >= 1.6x the best dense setup's (each length);
- sensitive prompts: neither time to first token nor decode more than 5% slower (every length and batch);
- every elastic row: KV-cache bytes within 10% of the bytes its routing implies, and its tokens equal the
  reference path's (a row that differs says how near a tie the reference's logits held where it first differed).

Each (prompt kind, length, batch) is judged on its best elastic setup (captured decode steps as they are, or
compiled; under `generate` or in the bench's own loop) against the best dense setup per metric, both taken from the
rows' raw timings; the line names the setups. A last line, not a bar, gives the batch-8 decode ratio in the steady
state where the rows carry it (each setup's median step after its first, which also sets up static storage and
captures its graph): the part of the decode bar's rate that the first step does not weigh on.

    python studies/request_speed_1.5b/request_bars.py benchmarks/results/request_qwen2.5-coder-1.5b-instruct.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elastic_attention.bench.request import setup_label, widest_margin

#: (what, prompt kind, length or None for every length, batch or None for every batch, metric, least speedup)
SPEED_BARS = (
    ("time to first token >= 1.4x faster, robust prompts at 32K", "robust", 32768, None, "ttft", 1.4),
    ("decode >= 1.6x faster, robust prompts at batch 8", "robust", None, 8, "decode", 1.6),
    ("time to first token at most 5% slower, sensitive prompts", "sensitive", None, None, "ttft", 1 / 1.05),
    ("decode at most 5% slower, sensitive prompts", "sensitive", None, None, "decode", 1 / 1.05),
)


def _tokens(length: int) -> str:
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def speedups(results: list[dict]) -> dict[tuple, dict]:
    """(prompt kind, length, batch) -> {"ttft": (speedup, elastic setup, dense setup), "decode": (...)}: the best
    elastic setup against the best dense setup, per metric, from the rows' ``ttft_s`` and ``decode_tokens_per_s``."""
    groups: dict[tuple, list[dict]] = {}
    for row in results:
        groups.setdefault((row["prompt_kind"], row["length"], row["batch"]), []).append(row)
    table = {}
    for key, rows in groups.items():
        dense = [row for row in rows if row["mode"] == "dense"]
        elastic = [row for row in rows if row["mode"] == "elastic"]
        if not dense or not elastic:
            continue
        fast_dense, fast_elastic = min(dense, key=lambda r: r["ttft_s"]), min(elastic, key=lambda r: r["ttft_s"])
        quick_dense = max(dense, key=lambda r: r["decode_tokens_per_s"])
        quick_elastic = max(elastic, key=lambda r: r["decode_tokens_per_s"])
        table[key] = {
            "ttft": (fast_dense["ttft_s"] / fast_elastic["ttft_s"], setup_label(fast_elastic), setup_label(fast_dense)),
            "decode": (quick_elastic["decode_tokens_per_s"] / quick_dense["decode_tokens_per_s"],
                       setup_label(quick_elastic), setup_label(quick_dense)),
        }
        if all(row.get("steady_decode_tokens_per_s") for row in rows):
            steady_dense = max(dense, key=lambda r: r["steady_decode_tokens_per_s"])
            steady_elastic = max(elastic, key=lambda r: r["steady_decode_tokens_per_s"])
            table[key]["steady"] = (steady_elastic["steady_decode_tokens_per_s"]
                                    / steady_dense["steady_decode_tokens_per_s"], setup_label(steady_elastic),
                                    setup_label(steady_dense))
    return table


def bars(results: list[dict]) -> list[str]:
    """One line per bar: met / missed / not measured, with every cell it covers."""
    table, lines = speedups(results), []
    for what, kind, length, batch, metric, least in SPEED_BARS:
        cells = {key: value[metric] for key, value in sorted(table.items())
                 if key[0] == kind and length in (None, key[1]) and batch in (None, key[2])}
        if not cells:
            lines.append(f"{what}: not measured (no cell of dense and elastic rows)")
            continue
        shown = ", ".join(f"{_tokens(key[1])} batch {key[2]}: {ratio:.2f}x ({mine} over {theirs})"
                          for key, (ratio, mine, theirs) in cells.items())
        verdict = "met" if all(ratio >= least for ratio, _, _ in cells.values()) else "missed"
        lines.append(f"{what}: {verdict} ({shown})")
    elastic = [row for row in results if row["mode"] == "elastic"]
    if elastic:
        ratios = [row["kv_cache_bytes"] / row["kv_cache_bytes_implied"] for row in elastic]
        worst = max(ratios, key=lambda ratio: abs(ratio - 1))
        verdict = "met" if all(abs(ratio - 1) <= 0.10 for ratio in ratios) else "missed"
        lines.append(f"KV-cache bytes within 10% of what the routing implies: {verdict} (farthest {worst:.3f}x)")
        unequal = []
        for row in elastic:
            if row["tokens_equal_reference"] is not True:
                margin = widest_margin(row)
                unequal.append(f"{row['prompt_kind']} {_tokens(row['length'])} batch {row['batch']} "
                               f"({setup_label(row)}{'; ' + margin if margin else ''})")
        lines.append(f"tokens equal the reference path's: {'missed: ' + ', '.join(unequal) if unequal else 'met'}")
    steady = {key: value["steady"] for key, value in sorted(table.items()) if "steady" in value and key[2] == 8}
    if steady:  # what the decode bars' rates are made of: the later steps, without the first one's set-up
        shown = ", ".join(f"{key[0]} {_tokens(key[1])}: {ratio:.2f}x ({mine} over {theirs})"
                          for key, (ratio, mine, theirs) in steady.items())
        lines.append(f"not a bar: decode at batch 8 in the steady state (median step after the first): {shown}")
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("request_json", type=Path, help="the --out file of `elastic-attention bench request`")
    args = parser.parse_args(argv)
    lines = bars(json.loads(args.request_json.read_text(encoding="utf-8"))["results"])
    for line in lines:
        print(f"- {line}")
    return lines


if __name__ == "__main__":
    main()

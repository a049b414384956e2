"""The README's results tables, made from the canonical results files of `benchmarks/results/` and nothing else.

    python -m benchmarks.readme_tables            # print every table
    python -m benchmarks.readme_tables --write    # put them into README.md, each between its markers

In README.md a table sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``; `tests/test_readme_tables.py`
fails when the text there differs from what this prints, so a number of the README changes only with its file.
The files are named in `CLAIMS` (one per claim the README makes); `benchmarks/results/README.md` indexes them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"

#: The README's claims and their canonical files (json, and the .md beside it that a reader follows).
CLAIMS = {
    "request": "request_qwen2.5-coder-1.5b-instruct",
    "quality": "real_model_1.5b_eval",
    "frontier": "real_model_1.5b_frontier",
    "prefill": "prefill",
    "decode_step": "decode_graphs",
    "kv_cache": "decode",
}
#: The shipped 1.5B router's training config: the tasks it trained on (the others of the suite were held out).
SHIPPED_1_5B_CONFIG = ROOT / "configs" / "qwen2.5_coder_1.5b_code_head_set_router_pattern_held_out.yaml"
#: The joint head-set search whose path holds the fixed set (`heads`) and the router's sets: its ``shape`` is
#: [layers, KV heads].
SEARCH_1_5B = RESULTS / "real_model_1.5b_head_set_search_2026-12-03.json"
LENGTHS = (8192, 16384)
MIB = 2**20


def load(claim: str) -> dict:
    return json.loads((RESULTS / f"{CLAIMS[claim]}.json").read_text())


def link(claim: str) -> str:
    name = f"{CLAIMS[claim]}.md"
    return f"[{name}](benchmarks/results/{name})"


def gpu(device: str) -> str:
    """The GPU models a file's ``device`` names: ``NVIDIA H100 80GB HBM3`` -> ``H100``; a merged file's
    ``NVIDIA H200 + NVIDIA H100 80GB HBM3`` -> ``H100 + H200``."""
    return " + ".join(sorted(set(re.findall(r"\b([A-Z]\d{2,4})\b", device)))) or device


def kilo(length: int) -> str:
    return f"{length // 1024}K"


def wrapped(paragraph: str) -> str:
    """A paragraph wrapped at the README's 120 columns (links and numbers kept whole)."""
    return textwrap.fill(paragraph, width=120, break_long_words=False, break_on_hyphens=False)


def percent_range(values: Sequence[float]) -> str:
    low, high = round(100 * min(values)), round(100 * max(values))
    return f"{low}%" if low == high else f"{low}-{high}%"


# -- the real request ---------------------------------------------------------------------------------------------

def request_table(document: dict) -> str:
    """Per prompt kind, length and batch: the fastest elastic setup against the fastest dense one, each number on
    its own (first token: the least time; decode: the most tokens/s; KV cache: the setups of those decode rates)."""
    rows = document["results"]
    dates = sorted({run["date"][:10] for run in document.get("runs", [document])})
    batches = sorted({row["batch"] for row in rows})
    lines = [
        wrapped(f"**A real request** (Qwen2.5-Coder-1.5B-Instruct with its shipped head-set router, "
        f"**{gpu(document['device'])}**, {', '.join(dates)}, {document['new_tokens']} new tokens, greedy, "
        f"{document['rows_per_kind']} prompts a kind, each time the median of three calls; "
        f"batch {' and '.join(map(str, batches))}: {link('request')}). Each number is set against the fastest dense "
        "setup of the same run: FlashAttention-4's dense prefill for the first token, and for decode a captured CUDA "
        "graph over transformers' static cache, with the same compiled layers, grouped projections and fused decode "
        "kernel."),
        "",
        "| prompts (MSR) | length, batch | first token | decode tokens/s | KV cache |",
        "|---|---|---|---|---|",
    ]
    for kind in ("robust", "sensitive"):
        cells = sorted({(row["length"], row["batch"]) for row in rows if row["prompt_kind"] == kind}, reverse=True)
        for index, (length, batch) in enumerate(cells):
            cell = [row for row in rows if (row["prompt_kind"], row["length"], row["batch"]) == (kind, length, batch)]
            dense = [row for row in cell if row["mode"] == "dense"]
            elastic = [row for row in cell if row["mode"] == "elastic"]
            first = (min(row["ttft_s"] for row in elastic), min(row["ttft_s"] for row in dense))
            fast_elastic = max(elastic, key=lambda row: row["decode_tokens_per_s"])
            fast_dense = max(dense, key=lambda row: row["decode_tokens_per_s"])
            rates = (fast_elastic["decode_tokens_per_s"], fast_dense["decode_tokens_per_s"])
            task = f", {document['tasks'][kind]}" if index == 0 else ""
            lines.append(
                f"| {kind}{task} ({elastic[0]['msr']:.2f}) | {kilo(length)}, {batch} "
                f"| {first[0]:.3f} s vs {first[1]:.3f} s ({first[1] / first[0]:.2f}x) "
                f"| {rates[0]:.0f} vs {rates[1]:.0f} ({rates[0] / rates[1]:.2f}x) "
                f"| {fast_elastic['kv_cache_bytes'] / MIB:.0f} vs {fast_dense['kv_cache_bytes'] / MIB:.0f} MiB |")
    return "\n".join(lines)


# -- quality on the real model ------------------------------------------------------------------------------------

def trained_tasks() -> set[str]:
    import yaml

    return set(yaml.safe_load(SHIPPED_1_5B_CONFIG.read_text())["data"]["tasks"])


def quality_numbers(document: dict) -> dict:
    """Elastic's share of full attention per task and length, its MSR by kind, and the fixed head set's and
    elastic's mean retention per length (`evaluation.frontier.point`)."""
    from elastic_attention.evaluation.frontier import point

    rows = document["results"]
    kinds = {row["task"]: row["kind"] for row in rows}
    cells = {(row["mode"], row["task"], row["length"]): row for row in rows}
    kept = {(task, length): cells["elastic", task, length]["accuracy"] / cells["full", task, length]["accuracy"]
            for task in kinds for length in LENGTHS}
    msr = {kind: [cells["elastic", task, length]["msr"] for task in kinds if kinds[task] == kind for length in LENGTHS]
           for kind in ("sensitive", "robust")}
    return {
        "kinds": kinds, "cells": cells, "kept": kept, "msr": {kind: sum(v) / len(v) for kind, v in msr.items()},
        "average_msr": sum(msr["sensitive"] + msr["robust"]) / len(msr["sensitive"] + msr["robust"]),
        "elastic": {length: point(rows, "elastic", length) for length in LENGTHS},
        "heads": {length: point(rows, "heads", length) for length in LENGTHS},
    }


def quality_table(document: dict) -> str:
    numbers = quality_numbers(document)
    kinds, cells, kept = numbers["kinds"], numbers["cells"], numbers["kept"]
    trained = trained_tasks()
    graded = {row["task"] for row in document["results"] if row["accuracy"] != row["exact_match"]}
    heads = numbers["heads"]
    layers, kv_heads = json.loads(SEARCH_1_5B.read_text())["shape"]
    layers_heads = layers * kv_heads
    sparse_heads = [round(heads[length].msr * layers_heads) for length in LENGTHS]
    lines = [
        wrapped(f"**Quality on the real model** (Qwen2.5-Coder-1.5B-Instruct, its shipped head-set router, "
        f"{cells['elastic', next(iter(kinds)), LENGTHS[0]]['samples']} rows a cell, {gpu(document['device'])}, "
        f"{document['date'][:10]}, {link('quality')}): accuracy, "
        "elastic's MSR, and elastic's share of full attention's accuracy; `heads` is one fixed head set searched on "
        f"the sensitive tasks, at elastic's average MSR ({sparse_heads[0]} sparse heads of {layers_heads} at "
        f"{kilo(LENGTHS[0])}, {sparse_heads[1]} at {kilo(LENGTHS[1])})."),
        "",
        "| task (kind) | full 8K / 16K | all-SSA 8K / 16K | elastic 8K (MSR) | kept | elastic 16K (MSR) | kept "
        "| heads 8K / 16K |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("sensitive", "robust"):
        for task in [task for task in kinds if kinds[task] == kind]:
            digits = 3 if task in graded else 2
            notes = [kind] + (["edit similarity"] if task in graded else []) + ([] if task in trained else ["held out"])

            def pair(mode: str) -> str:
                return " / ".join(f"{cells[mode, task, length]['accuracy']:.{digits}f}" for length in LENGTHS)

            elastic = [f"{cells['elastic', task, length]['accuracy']:.{digits}f} "
                       f"({cells['elastic', task, length]['msr']:.2f}) | {100 * kept[task, length]:.0f}%"
                       for length in LENGTHS]
            lines.append(f"| {task} ({', '.join(notes)}) | {pair('full')} | {pair('sparse')} | {elastic[0]} "
                         f"| {elastic[1]} | {pair('heads')} |")
    elastic = numbers["elastic"]
    gaps = [100 * (elastic[length].retention - heads[length].retention) for length in LENGTHS]
    lines += [
        "",
        wrapped(f"Mean retention over the eight tasks: elastic {100 * elastic[LENGTHS[0]].retention:.1f}% / "
        f"{100 * elastic[LENGTHS[1]].retention:.1f}% at {kilo(LENGTHS[0])} / {kilo(LENGTHS[1])}, the fixed set "
        f"{100 * heads[LENGTHS[0]].retention:.1f}% / {100 * heads[LENGTHS[1]].retention:.1f}% "
        f"({gaps[0]:+.1f} / {gaps[1]:+.1f} points)."),
    ]
    return "\n".join(lines)


# -- the summary of every claim -----------------------------------------------------------------------------------

def quality_row(document: dict) -> str:
    numbers = quality_numbers(document)
    kinds, kept = numbers["kinds"], numbers["kept"]
    share = {kind: [kept[task, length] for task in kinds if kinds[task] == kind for length in LENGTHS]
             for kind in ("sensitive", "robust")}
    heads, elastic = numbers["heads"], numbers["elastic"]
    return (f"| Quality, Qwen2.5-Coder-1.5B + shipped head-set router, 8K / 16K ({gpu(document['device'])}, "
            f"{document['date'][5:10]}) | sensitive tasks: {percent_range(share['sensitive'])} of full attention's "
            f"accuracy at MSR {numbers['msr']['sensitive']:.2f}; robust: {percent_range(share['robust'])} at MSR "
            f"{numbers['msr']['robust']:.2f} (average {numbers['average_msr']:.3f}) | full attention; the joint "
            f"searched head set at elastic's MSR keeps {100 * heads[8192].retention:.1f}% / "
            f"{100 * heads[16384].retention:.1f}% (mean over {len(kinds)} tasks; elastic "
            f"{100 * elastic[8192].retention:.1f}% / {100 * elastic[16384].retention:.1f}%) | {link('quality')} |")


def frontier_row(document: dict) -> str:
    from elastic_attention.evaluation.frontier import point

    rows, length = document["results"], 16384
    searched = [point(rows, f"heads@{msr}", length) for msr in ("0.5", "0.7")]
    static = point(rows, "static@0.5", length)
    return (f"| Static frontier, Qwen2.5-Coder-1.5B, {kilo(length)} ({gpu(document['device'])}, "
            f"{document['date'][5:10]}) | one searched head set (no router): mean retention over "
            f"{len(searched[0].tasks)} tasks {100 * searched[0].retention:.0f}% at MSR 0.5, "
            f"{100 * searched[1].retention:.0f}% at 0.7 | full attention; retrieval-score static hybrid "
            f"{100 * static.retention:.0f}% at MSR 0.5 | {link('frontier')} |")


def prefill_row(document: dict) -> str:
    rows = document["results"]

    def elastic(configuration: str, length: int) -> dict:
        return next(row for row in rows if row["model"] == f"elastic-{configuration}" and row["length"] == length)

    msr = elastic("fa-ssa", 131072)["msr"]
    dates = sorted({run["date"][5:10] for run in document["runs"]})
    return (f"| Prefill, Llama-3.1-8B shape, MSR {msr:.1f} ({gpu(document['device'])}, {', '.join(dates)}) "
            f"| {elastic('fa-ssa', 131072)['speedup_vs_fa4_dense']:.2f}x at 128K, "
            f"{elastic('fa-ssa', 262144)['speedup_vs_fa4_dense']:.2f}x at 256K, "
            f"{elastic('fa-ssa', 32768)['speedup_vs_fa4_dense']:.2f}x at 32K; XA-SSA "
            f"{elastic('xa-ssa', 262144)['speedup_vs_fa4_dense']:.2f}x at 256K | dense FlashAttention-4 of the same "
            f"run (cuDNN SDPA at 256K: {elastic('fa-ssa', 262144)['speedup_vs_sdpa']:.2f}x) | {link('prefill')} |")


def decode_step_row(document: dict) -> str:
    cell = {row["kind"]: row for row in document["results"] if (row["length"], row["batch"]) == (131072, 1)}
    ours, theirs = cell["bounded"], cell["dense_static_graph"]
    return (f"| Decode step, 8B shape, MSR {document['elastic']['msr']:.1f}, 128K, batch 1 "
            f"({gpu(document['device'])}, {document['date'][5:10]}) | {1000 * ours['step_s']:.2f} ms "
            f"({ours['speedup_vs_dense_static_graph']:.2f}x faster; {ours['step_over_bound']:.2f}x its bandwidth "
            f"bound) | transformers' static cache in a CUDA graph, {1000 * theirs['step_s']:.2f} ms "
            f"| {link('decode_step')} |")


def kv_cache_row(document: dict) -> str:
    row = next(row for row in document["rows"] if (row["length"], row["batch"], row["cache"]) == (131072, 1, "bounded"))
    return (f"| KV cache, 8B shape, 128K, MSR {document['elastic']['msr']:.1f} ({gpu(document['device'])}, "
            f"{document['date'][5:10]}) | {row['bytes_vs_full']:.2f}x the bytes | the model's full cache "
            f"| {link('kv_cache')} |")


def summary_table() -> str:
    return "\n".join([
        "| what (hardware, date) | elastic attention | against | file |",
        "|---|---|---|---|",
        quality_row(load("quality")),
        frontier_row(load("frontier")),
        prefill_row(load("prefill")),
        decode_step_row(load("decode_step")),
        kv_cache_row(load("kv_cache")),
    ])


TABLES: dict[str, Callable[[], str]] = {
    "request": lambda: request_table(load("request")),
    "summary": summary_table,
    "quality": lambda: quality_table(load("quality")),
}


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- results:{name} -->\n)(.*?)(\n<!-- /results:{name} -->)", re.DOTALL)


def readme_blocks(text: str) -> dict[str, str]:
    """What README.md holds between each table's markers."""
    return {name: found.group(2) for name in TABLES if (found := block(name).search(text))}


def write(text: str) -> str:
    for name, make in TABLES.items():
        pattern = block(name)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- results:{name} --> ... <!-- /results:{name} --> block")
        text = pattern.sub(lambda found, table=make(): found.group(1) + table + found.group(3), text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.readme_tables", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="write the tables into README.md between their markers")
    args = parser.parse_args(argv)
    if args.write:
        README.write_text(write(README.read_text()))
        print(f"wrote {len(TABLES)} tables into {README}")
    else:
        for name, make in TABLES.items():
            print(f"<!-- results:{name} -->\n{make()}\n<!-- /results:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())

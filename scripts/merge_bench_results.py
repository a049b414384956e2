"""One results table from several runs of a benchmark (`elastic-attention bench request` or `bench prefill`): a cell
measured again in a later run replaces the earlier run's rows in place (request: prompt kind, length and batch;
prefill: length and model); every row says which run it came from (``run``, an index into ``runs``: date, device,
versions, command, source file). Runs of another GPU kind or setup are refused. Writes the JSON and its markdown
table (same name, ``.md``); `studies/request_speed_1.5b/request_bars.py` reads a merged request file as it reads one run's.

    python scripts/merge_bench_results.py request OLDEST.json ... NEWEST.json \
        --out benchmarks/results/request_qwen2.5-coder-1.5b-instruct.json
    python scripts/merge_bench_results.py prefill OLDEST.json ... NEWEST.json --out benchmarks/results/prefill.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elastic_attention.bench import prefill, request
from elastic_attention.bench.merge_runs import RULES, merge_runs, rows_of
from elastic_attention.bench.timing import write_result
from elastic_attention.io import atomic_write_text

MARKDOWN = {"request": request.markdown, "prefill": prefill.markdown}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmark", choices=sorted(RULES))
    parser.add_argument("files", nargs="+", type=Path, help="the benchmark's JSON files, oldest first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    documents = []
    for path in args.files:
        document = json.loads(path.read_text())
        if args.benchmark == "prefill":  # files written before 2026-12-05 lack the within-run speedups
            document = {**document, "results": prefill.with_speedups(rows_of(document))}
        documents.append((path.name, document))
    merged = merge_runs(documents, RULES[args.benchmark])
    write_result(args.out, merged)
    atomic_write_text(args.out.with_suffix(".md"), MARKDOWN[args.benchmark](merged))
    print(f"{len(merged['results'])} rows from {len(merged['runs'])} runs -> {args.out}")


if __name__ == "__main__":
    main()

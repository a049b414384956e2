"""One request table from several runs of `elastic-attention bench request`: a cell (prompt kind, length, batch)
measured again in a later run replaces the earlier run's rows; every row says which run it came from (``run``, an
index into ``runs``: date, device, versions, command, source file). Writes the JSON and its markdown table (same
name, ``.md``); `scripts/request_bars.py` reads the result as it reads one run's.

    python scripts/merge_request_results.py OLDEST.json ... NEWEST.json \
        --out benchmarks/results/request_qwen2.5-coder-1.5b-instruct.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elastic_attention.bench.request import markdown, merge_results
from elastic_attention.bench.timing import write_result
from elastic_attention.io import atomic_write_text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="request JSON files, oldest first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    merged = merge_results([(path.name, json.loads(path.read_text())) for path in args.files])
    write_result(args.out, merged)
    atomic_write_text(args.out.with_suffix(".md"), markdown(merged))
    print(f"{len(merged['results'])} rows from {len(merged['runs'])} runs -> {args.out}")


if __name__ == "__main__":
    main()

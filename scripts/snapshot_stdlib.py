"""Which real text does the code suite read, and how was it made? This script writes that snapshot.

The code suite (`elastic_attention.evaluation.code_suite`) builds its long contexts from a fixed snapshot of the
Python standard library's source, shipped in the package so that rows do not depend on the Python installed on the
machine. This script made it, from CPython 3.11.7's `Lib/` (PSF licence, copied next to the snapshot):

  python scripts/snapshot_stdlib.py --lib /root/.pyenv/versions/3.11.7/lib/python3.11 \
      --out src/elastic_attention/assets/python_stdlib

It takes every top-level module and the packages listed in PACKAGES, skips generated, platform-specific and
joke modules (SKIP), keeps only files that parse as Python, normalizes line ends, and writes `corpus.jsonl.xz`
(one JSON object per file: ``path``, ``text``) in sorted path order, with `LICENSE.txt`. The output is byte-for-byte
the same for the same `Lib/`.
"""

from __future__ import annotations

import argparse
import ast
import json
import lzma
import shutil
from pathlib import Path

PACKAGES = ("json", "logging", "collections", "http", "urllib", "email", "concurrent/futures", "importlib")
SKIP = {"this.py", "antigravity.py", "__phello__.foo.py", "_aix_support.py", "_bootsubprocess.py"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, type=Path, help="the Lib/ folder of a CPython installation")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    files = sorted(args.lib.glob("*.py")) + sorted(f for p in PACKAGES for f in (args.lib / p).glob("*.py"))
    records = []
    for file in files:
        relative = file.relative_to(args.lib).as_posix()
        if file.name in SKIP or file.name.startswith("_sysconfigdata"):
            continue
        text = file.read_text(encoding="utf-8").replace("\r\n", "\n")
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        records.append({"path": relative, "text": text})
    records.sort(key=lambda record: record["path"])
    args.out.mkdir(parents=True, exist_ok=True)
    payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")
    with lzma.open(args.out / "corpus.jsonl.xz", "wb", preset=9) as stream:
        stream.write(payload)
    shutil.copyfile(args.lib / "LICENSE.txt", args.out / "LICENSE.txt")
    print(f"{len(records)} files, {len(payload) / 1e6:.2f} MB of text -> {args.out}")


if __name__ == "__main__":
    main()

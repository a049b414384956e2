"""Row cells through the command line: `elastic-attention rows` writes them, `eval --rows` reads them (and refuses
cells of another seed), on the shipped tiny backbone."""

from __future__ import annotations

import json

from elastic_attention.assets import TINY_BACKBONE
from elastic_attention.cli import main as cli_main


def test_eval_reads_the_cells_that_rows_wrote(tmp_path, capsys):
    cells = tmp_path / "cells"
    assert cli_main(["rows", "--tokenizer", str(TINY_BACKBONE), "--suite", "synthetic", "--tasks", "local_recall",
                     "--lengths", "601", "--samples", "3", "--seed", "7", "--out", str(cells)]) == 0
    path = cells / "local_recall_601.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["cell"]["seed"] == 7
    common = ["eval", "--model", str(TINY_BACKBONE), "--modes", "full", "--suite", "synthetic", "--tasks",
              "local_recall", "--lengths", "601", "--samples", "2", "--rows", str(cells), "--device", "cpu"]
    assert cli_main([*common, "--seed", "7", "--out", str(tmp_path / "first")]) == 0
    predictions = json.loads((tmp_path / "first" / "eval.json").read_text())["results"][0]["predictions"]
    # the evaluation scores the rows of the file: make each answer what the model said, and every row scores 1
    rows = [json.loads(line) for line in lines[1:]]
    for row, prediction in zip(rows, predictions):
        row["answer"] = prediction
    path.write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    assert cli_main([*common, "--seed", "7", "--out", str(tmp_path / "eval")]) == 0
    document = json.loads((tmp_path / "eval" / "eval.json").read_text())
    (cell,) = document["results"]
    assert cell["samples"] == 2 and cell["accuracy"] == 1.0 and cell["predictions"] == predictions
    assert document["settings"]["rows_dir"] == str(cells)
    capsys.readouterr()
    assert cli_main([*common, "--seed", "8", "--out", str(tmp_path / "other")]) == 2
    assert "holds {'seed': 7}" in capsys.readouterr().err

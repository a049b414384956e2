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


def test_read_cells_reads_every_cell_of_a_folder(tmp_path):
    """Oracle: `read_cell` of each (task, length) the folder holds, with the rows capped at what a cell has."""
    import pytest
    from transformers import AutoTokenizer

    from elastic_attention.errors import InputError
    from elastic_attention.evaluation.row_cells import read_cell, read_cells

    cells = tmp_path / "cells"
    for tasks, samples in (("local_recall", "3"), ("needle_single", "2")):
        assert cli_main(["rows", "--tokenizer", str(TINY_BACKBONE), "--suite", "synthetic", "--tasks", tasks,
                         "--lengths", "601,455", "--samples", samples, "--seed", "7", "--out", str(cells)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(TINY_BACKBONE)
    got = read_cells(cells, seed=7, samples=3, tokenizer=tokenizer)
    assert [(task, length, len(rows)) for task, length, rows in got] == [
        ("local_recall", 455, 3), ("local_recall", 601, 3), ("needle_single", 455, 2), ("needle_single", 601, 2)]
    for task, length, rows in got:
        assert rows == read_cell(cells, task=task, length=length, seed=7, samples=len(rows), tokenizer=tokenizer)
    with pytest.raises(InputError, match="holds {'seed': 7}"):
        read_cells(cells, seed=8, samples=3, tokenizer=tokenizer)

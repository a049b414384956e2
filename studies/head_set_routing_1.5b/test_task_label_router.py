"""task_label_router.py: fitted on a training run's router inputs with a set per task, it sorts unseen rows
as their inputs allow, and writes choices `studies/head_set_routing_1.5b/row_outcomes.py --predict` reads."""

import json

import pytest
import torch
from safetensors.torch import save_file

import row_outcomes
import task_label_router


@pytest.mark.slow  # a study's script end to end on a model: make test-slow and CI run it
def test_rows_are_sorted_by_the_feature_that_tells_their_tasks_apart(tmp_path, capsys):
    """Oracle: inputs whose first coordinate of head 0 is +6 for task a and -6 for task b, the rest noise. Unseen
    rows on each side go to that side's set; a row of a third task placed on a's side goes to a's set."""
    script = task_label_router
    generator = torch.Generator().manual_seed(0)

    def rows(sign: float, count: int) -> torch.Tensor:
        inputs = torch.randn(count, 2, 8, generator=generator)
        inputs[:, 0, 0] += 6.0 * sign
        return inputs

    packs = {"0": ["a", "b", "a"], "1": ["b", "a"], "2": ["a", "b", "b", "a"]}
    tensors = {}
    for index, tasks in packs.items():
        tensors[f"{index}.router_input"] = torch.cat([rows(1.0 if task == "a" else -1.0, 1) for task in tasks])
        tensors[f"{index}.losses"] = torch.zeros(len(tasks), 3)
        tensors[f"{index}.tokens"] = torch.ones(len(tasks), dtype=torch.int64)
    for repeat in range(20):  # more packs of the same two tasks, so the fit has rows enough
        tensors[f"{3 + repeat}.router_input"] = torch.cat([rows(1.0, 1), rows(-1.0, 1)])
        tensors[f"{3 + repeat}.losses"] = torch.zeros(2, 3)
        tensors[f"{3 + repeat}.tokens"] = torch.ones(2, dtype=torch.int64)
        packs[str(3 + repeat)] = ["a", "b"]
    save_file(tensors, tmp_path / "set_losses.safetensors",
              metadata={"tasks": json.dumps(packs), "set_msrs": json.dumps([0.0, 0.5, 1.0]),
                        "router_pooling": json.dumps([100, 100])})
    save_file(tensors, tmp_path / "set_losses_unrecorded.safetensors",
              metadata={"tasks": json.dumps(packs), "set_msrs": json.dumps([0.0, 0.5, 1.0])})
    pooled = {"pooling": "100 + 100"}
    save_file({"a@600@0@6": rows(1.0, 6), "b@600@0@6": rows(-1.0, 6), "c@600@0@6": rows(1.0, 6)},
              tmp_path / "inputs.safetensors", metadata=pooled)

    document = script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                            str(tmp_path / "inputs.safetensors"), "--sets", "a=0,b=2", "--steps", "300",
                            "--out", str(tmp_path / "choices.json")])
    assert document["training_rows_on_their_set"] == 1.0 and document["set_msrs"] == [0.0, 0.5, 1.0]
    chosen = {cell: torch.tensor(logits).argmax(-1).tolist() for cell, logits in document["logits"].items()}
    assert chosen == {"a@600": [0] * 6, "b@600": [2] * 6, "c@600": [0] * 6}
    assert json.loads((tmp_path / "choices.json").read_text())["logits"] == document["logits"]
    # the format row_outcomes reads: the MSR of each row's chosen set
    outcomes = row_outcomes
    assert outcomes.chosen_msrs(document, "b", 600) == [1.0] * 6

    # more training rows from a kept inputs file drawn with another seed join the fit; the evaluation's own are refused
    save_file({"a@600@7@4": rows(1.0, 4), "b@600@7@4": rows(-1.0, 4)}, tmp_path / "more.safetensors", metadata=pooled)
    more = script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                        str(tmp_path / "inputs.safetensors"), "--train-inputs", str(tmp_path / "more.safetensors"),
                        "--sets", "a=0,b=2", "--steps", "300"])
    assert {cell: torch.tensor(logits).argmax(-1).tolist() for cell, logits in more["logits"].items()} == chosen
    with pytest.raises(SystemExit):
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "inputs.safetensors"), "--train-inputs", str(tmp_path / "inputs.safetensors"),
                     "--sets", "a=0,b=2,c=0"])
    capsys.readouterr()
    save_file({"a@600@7@4": rows(1.0, 4)}, tmp_path / "other.safetensors", metadata={"pooling": "40 + 30"})
    with pytest.raises(SystemExit):  # kept with other metadata than the evaluation's inputs
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "inputs.safetensors"), "--train-inputs", str(tmp_path / "other.safetensors"),
                     "--sets", "a=0,b=2"])
    assert "another model, layer, dtype or pooling" in capsys.readouterr().err
    save_file({"a@600@0@6": rows(1.0, 6)}, tmp_path / "pooled.safetensors", metadata={"pooling": "40 + 30"})
    with pytest.raises(SystemExit):  # evaluation rows pooled over other spans than the set losses' training rows
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "pooled.safetensors"), "--sets", "a=0,b=2"])
    assert "pooled over 40 + 30 tokens, the set losses over 100 + 100" in capsys.readouterr().err
    for set_losses, inputs in (("set_losses_unrecorded", "inputs"), ("set_losses", "more_unrecorded")):
        save_file({"a@600@0@6": rows(1.0, 6)}, tmp_path / "more_unrecorded.safetensors")
        with pytest.raises(SystemExit):  # a file that does not say how its inputs were pooled
            script.main(["--set-losses", str(tmp_path / f"{set_losses}.safetensors"), "--inputs",
                         str(tmp_path / f"{inputs}.safetensors"), "--sets", "a=0,b=2"])
        assert "does not record the spans" in capsys.readouterr().err
    # a task held out leaves the fit: the rows that were b's training rows no longer exist, so the fit puts every
    # unseen row, b's included, on a's set; a held-out task without training rows is refused by name
    held = script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                        str(tmp_path / "inputs.safetensors"), "--sets", "a=0", "--hold-out", "b", "--steps", "100"])
    assert held["held_out"] == ["b"] and held["training_rows_on_their_set"] == 1.0
    assert {cell: torch.tensor(logits).argmax(-1).tolist() for cell, logits in held["logits"].items()} == {
        "a@600": [0] * 6, "b@600": [0] * 6, "c@600": [0] * 6}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "inputs.safetensors"), "--sets", "a=0,b=2", "--hold-out", "c"])
    assert "--hold-out names ['c'], which have no training rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a task of the training rows without a set
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "inputs.safetensors"), "--sets", "a=0"])
    with pytest.raises(SystemExit):  # a set the file does not have
        script.main(["--set-losses", str(tmp_path / "set_losses.safetensors"), "--inputs",
                     str(tmp_path / "inputs.safetensors"), "--sets", "a=0,b=3"])

"""task_set_config.py: each task gets the sparsest point of its own search that keeps the share at every
length (a slow per-cell rule here is the oracle), and the config it writes trains: its sets load, one per choice,
with each task's target on its set."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import task_set_config

SHAPE = (2, 4)  # 8 heads: a point at MSR m has round(8 m) sparse heads
PATH = [[0, 0], [1, 3], [0, 2], [1, 1], [0, 1], [1, 0], [0, 3], [1, 2]]


@pytest.fixture(scope="module")
def tool():
    return task_set_config


def _search_file(path):
    routing = torch.ones(SHAPE, dtype=torch.bool)
    for layer, head in PATH[:4]:
        routing[layer, head] = False
    path.write_text(json.dumps({"sets": [{"msr_asked": 0.5, "full_heads": routing.tolist()}], "path": PATH}))
    return path


def _cell(mode, task, length, accuracy, msr):
    return {"mode": mode, "task": task, "kind": "sensitive", "length": length, "accuracy": accuracy, "msr": msr}


def _eval_file(path, rows):
    path.write_text(json.dumps({"results": rows}))
    return path


def test_the_sparsest_point_keeping_the_share_at_every_length_is_chosen(tool):
    """Oracle: for each point, every length's accuracy over full attention's, checked one cell at a time."""
    rows = [_cell("full", "passkey", 8192, 1.0, 0.0), _cell("full", "passkey", 16384, 0.8, 0.0)]
    accuracy = {("heads@0.625", 8192): 1.0, ("heads@0.625", 16384): 0.8, ("heads@0.75", 8192): 1.0,
                ("heads@0.75", 16384): 0.76, ("heads@0.875", 8192): 0.6, ("heads@0.875", 16384): 0.8}
    rows += [_cell(mode, "passkey", length, value, float(mode[6:])) for (mode, length), value in accuracy.items()]
    rows.append(_cell("heads@0.875", "multikey", 8192, 1.0, 0.875))  # another task's cell is not this one's
    for share, expected in ((0.98, "heads@0.625"), (0.95, "heads@0.75"), (0.5, "heads@0.875"), (1.01, None)):
        oracle = [mode for mode in ("heads@0.625", "heads@0.75", "heads@0.875")
                  if accuracy[(mode, 8192)] / 1.0 >= share and accuracy[(mode, 16384)] / 0.8 >= share]
        assert (oracle[-1] if oracle else None) == expected
        mode, points = tool.sparsest_point_keeping(rows, "passkey", share)
        assert mode == expected and points["heads@0.75"]["kept"] == {8192: 1.0, 16384: pytest.approx(0.95)}
    with pytest.raises(ValueError, match="no full-attention cell there"):
        tool.sparsest_point_keeping([_cell("heads@0.5", "passkey", 4096, 1.0, 0.5)], "passkey", 0.9)


def test_the_config_written_trains_on_the_chosen_sets(tool, tmp_path, monkeypatch):
    from elastic_attention.training.train_config import TrainConfig

    monkeypatch.chdir(tmp_path)
    joint = _search_file(tmp_path / "joint.json")
    own = _search_file(tmp_path / "passkey.json")
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "model": "unused", "elastic": {"configuration": "fa-ssa", "block_size": 16, "sink_tokens": 16,
                                       "local_tokens": 32, "head_set_choices": 3},
        "data": {"source": "code", "tasks": ["passkey", "multikey", "next_line"], "lengths": [4096], "rows": 8},
        "targets": {"passkey": 0.5, "multikey": 0.0, "next_line": 1.0},
        "head_set_objective": "expected", "initial_full_heads": str(joint),
        "head_set_choices_msrs": [0.0, 0.5, 1.0]}))
    full = _eval_file(tmp_path / "full.json", [_cell("full", task, length, 1.0, 0.0)
                                               for task in ("passkey", "multikey") for length in (8192, 16384)])
    passkey = _eval_file(tmp_path / "passkey_eval.json", [
        _cell(f"heads@{msr}", "passkey", length, 1.0 if msr < 0.8 else 0.5, msr)
        for msr in (0.625, 0.75, 0.875) for length in (8192, 16384)])
    multikey = _eval_file(tmp_path / "multikey_eval.json", [_cell("heads@0.75", "multikey", 8192, 0.5, 0.75)])
    out = tmp_path / "task_sets.yaml"
    chosen = tool.main(["--base", str(base), "--choice-msrs", "0.0,1.0", "--task-set", "passkey", str(own),
                        str(passkey), "--task-set", "multikey", str(own), str(multikey), "--full", str(full),
                        "--out", str(out)])
    assert chosen == {"passkey": {"mode": "heads@0.75", "msr": 0.75, "set": f"{own}@0.75"}}
    written = out.read_text()
    assert written.startswith(f"# elastic-attention train {out}")
    config = TrainConfig.from_yaml(out)
    assert config.head_set_choices_msrs == [0.0, 1.0] and config.head_set_choices_extra == [f"{own}@0.75"]
    assert config.targets == {"passkey": 0.75, "multikey": 0.0, "next_line": 1.0}
    sets = config.head_set_choices()
    assert sets.shape == (3, *SHAPE) and [int((~s).sum()) for s in sets] == [0, 8, 6]
    with pytest.raises(SystemExit):
        tool.main(["--base", str(base), "--task-set", "recent_fact", str(own), str(passkey), "--out", str(out)])
    with pytest.raises(SystemExit):
        tool.main(["--base", str(base), "--task-set", "passkey", str(own), str(tmp_path / "none.json"),
                   "--out", str(out)])

"""Output folders: one writer at a time (a killed one leaves no stuck lock), checked for writing before any model
loads, an evaluation folder's files always from one run, and --overwrite all or nothing around links."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from elastic_attention.assets import TINY_BACKBONE
from elastic_attention.cli import main as cli_main
from elastic_attention.errors import ConfigError
from elastic_attention.folders import LOCK_FILE, FolderLock, check_writable, delete_moved, move_aside

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    with FolderLock(tmp_path / "out", "a training run"):
        with pytest.raises(ConfigError, match=f"in use by process {os.getpid()} on .*since .*writes a training run "
                                              f"there; wait for it to end or choose another folder"):
            FolderLock(tmp_path / "out", "an evaluation").acquire()
    with FolderLock(tmp_path / "out", "an evaluation"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from elastic_attention.folders import FolderLock; "
                               f"held = FolderLock({str(tmp_path)!r}, 'x').acquire(); print('held', flush=True); "
                               "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"in use by process {holder.pid}"):
        FolderLock(tmp_path, "y").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with FolderLock(tmp_path, "y"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.parametrize("how", ["parent_is_a_file", "folder_is_a_file"])
def test_an_unwritable_folder_is_named(tmp_path, how):
    (tmp_path / "file").write_text("x")
    folder = tmp_path / "file" / "out" if how == "parent_is_a_file" else tmp_path / "file"
    with pytest.raises(ConfigError, match=f"cannot write the run to {folder}: .*; choose a folder you can write"):
        check_writable(folder, "the run")


def _train_config(tmp_path, output_dir, model):
    config = {"model": str(model), "output_dir": str(output_dir),
              "elastic": {"block_size": 32, "sink_tokens": 32, "local_tokens": 64, "xa_stride": 8},
              "data": {"tasks": ["needle_single", "local_recall"], "lengths": [200], "rows": 4, "budget": 600},
              "steps": 1, "packs_per_step": 1}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("command", ["train", "eval"])
def test_unwritable_outputs_fail_before_the_model_loads(tmp_path, capsys, monkeypatch, command):
    """Oracle: loading a model raises here, so an exit of 2 with the folder's line means the check came first."""
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the output folder was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    if command == "train":
        argv = ["train", str(_train_config(tmp_path, out, TINY_BACKBONE)), "--no-progress"]
    else:
        argv = ["eval", "--model", str(TINY_BACKBONE), "--tasks", "local_recall", "--lengths", "300", "--samples",
                "1", "--modes", "full", "--device", "cpu", "--out", str(out)]
    assert cli_main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"cannot write {'a training run' if command == 'train' else 'an evaluation'} to {out}" in error[0]


@pytest.mark.parametrize("argv", [
    ["demo", "--out", "{out}"],
    ["eval-merge", "{json}", "--out", "{out}"],
    ["bench", "layer", "--lengths", "256", "--out", "{out}/layer.json"],
    ["models", "fetch", "qwen2.5-coder-0.5b-instruct", "--out", "{out}/model"],
], ids=["demo", "eval-merge", "bench", "models-fetch"])
def test_every_command_checks_its_output_folder_first(tmp_path, capsys, argv):
    (tmp_path / "file").write_text("x")
    (tmp_path / "eval.json").write_text(json.dumps({"results": []}))
    out = tmp_path / "file" / "out"
    argv = [item.format(out=out, json=tmp_path / "eval.json") for item in argv]
    assert cli_main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cannot write" in error[0] and "Not a directory" in error[0]


def test_a_second_training_run_into_a_held_folder_is_refused(tmp_path, random_suite_backbone):
    from elastic_attention.training import TrainConfig, train

    config = TrainConfig.from_yaml(_train_config(tmp_path, tmp_path / "run", random_suite_backbone))
    with FolderLock(tmp_path / "run", "a training run"):
        with pytest.raises(ConfigError, match=f"run is in use by process {os.getpid()}.*which writes a training run there"):
            train(config, progress=False)
    assert not (tmp_path / "run" / "metrics.csv").exists()
    train(config, progress=False)
    assert (tmp_path / "run" / "router").is_dir()


def test_an_evaluation_folder_always_describes_one_run(tmp_path, capsys):
    out = tmp_path / "out"
    common = ["eval", "--model", str(TINY_BACKBONE), "--tasks", "local_recall", "--samples", "1", "--modes", "full",
              "--device", "cpu", "--out", str(out)]
    assert cli_main([*common, "--lengths", "300"]) == 0
    first = {name: (out / name).read_bytes() for name in ("eval.json", "eval.md", "accuracy_vs_msr.png")}
    assert cli_main([*common, "--lengths", "400"]) == 2
    assert "holds the results of another evaluation (eval.json, eval.md, accuracy_vs_msr.png; settings that " \
           "differ: lengths); pass --overwrite" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in first} == first  # untouched
    (out / "eval.md").unlink()  # a cut run leaves eval.json alone: a rerun of the same settings replaces it
    assert cli_main([*common, "--lengths", "300"]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(first)
    assert cli_main([*common, "--lengths", "400", "--overwrite"]) == 0
    assert "| local_recall | robust | 400 |" in (out / "eval.md").read_text()
    assert [row["length"] for row in json.loads((out / "eval.json").read_text())["results"]] == [400]


def test_overwrite_moves_an_old_run_aside_whole_and_never_follows_its_links(tmp_path, random_suite_backbone):
    """The old run's router is a link to an adapter elsewhere: --overwrite removes the link, never the adapter,
    and leaves no file of the old run."""
    from elastic_attention.training import TrainConfig, train

    run = tmp_path / "run"
    config = TrainConfig.from_yaml(_train_config(tmp_path, run, random_suite_backbone))
    train(config, progress=False)
    elsewhere = tmp_path / "kept_adapter"
    (run / "router").rename(elsewhere)
    (run / "router").symlink_to(elsewhere, target_is_directory=True)
    (run / "metrics.csv").write_text("old\n")
    train(config, overwrite=True, progress=False)
    assert (elsewhere / "router.safetensors").is_file()  # the link's target is untouched
    assert (run / "router").is_dir() and not (run / "router").is_symlink()
    assert (run / "metrics.csv").read_text() != "old\n"
    assert not [p for p in run.iterdir() if p.name.startswith(".replaced-")]


def test_move_aside_is_all_or_nothing(tmp_path, monkeypatch):
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name)
    real_rename = os.rename

    def failing(source, target):
        if Path(source).name == "c":
            raise OSError("disk full")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="disk full"):
        move_aside(tmp_path, ["a", "b", "c"])
    monkeypatch.setattr(os, "rename", real_rename)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # all back, no aside folder left
    aside = move_aside(tmp_path, ["a", "b"])
    assert sorted(p.name for p in aside.iterdir()) == ["a", "b"]
    delete_moved(aside)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]

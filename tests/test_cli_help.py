"""Every `--help` of the command line names its command, shows defaults, gives an example and cites no issue."""

from __future__ import annotations

import re
import sys

import pytest

from elastic_attention.cli import SUITE_TASKS, build_parser, main

COMMANDS = sorted(name for name in build_parser()._subparsers._group_actions[0].choices if name != "lm-eval")
BENCHMARKS = ["layer", "prefill", "decode", "decode-graphs", "train-step", "cpu-prefill", "request"]


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [[name] for name in COMMANDS] + [["bench", name] for name in BENCHMARKS],
                         ids=" ".join)
def test_each_help_names_its_command_gives_an_example_and_cites_no_issue(argv, capsys):
    printed = help_of(argv, capsys)
    assert printed.startswith(f"usage: elastic-attention {' '.join(argv)} ")
    assert "example:\n  elastic-attention " in printed
    assert not re.search(r"issue \d", printed, flags=re.IGNORECASE)
    if argv[0] not in ("bench", "train", "pretrain") or len(argv) > 1:  # these have no option with a default
        assert "(default: " in " ".join(printed.split())  # argparse wraps lines


def test_the_help_spells_out_defaults_and_each_suites_task_names(capsys):
    printed = " ".join(help_of(["eval"], capsys).split())  # argparse wraps lines
    assert "(default: full,sparse)" in printed and "(default: 20)" in printed
    assert all(task in printed for tasks in SUITE_TASKS.values() for task in tasks)
    printed = " ".join(help_of(["try"], capsys).split())
    assert "passkey, multikey" in printed and "(default: passkey,next_line)" in printed
    assert "qwen2.5-coder-1.5b-instruct" in printed  # --router takes a shipped router's name
    assert "(default: 0.7)" in " ".join(help_of(["bench", "prefill"], capsys).split())


def test_the_written_out_task_names_are_the_suites(monkeypatch):
    from elastic_attention.evaluation.suites import get_suite

    assert {suite: tuple(get_suite(suite).tasks) for suite in SUITE_TASKS} == SUITE_TASKS


def test_lm_eval_help_works_without_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError, as without the extra
    monkeypatch.delitem(sys.modules, "elastic_attention.harness", raising=False)
    assert main(["lm-eval", "--help"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: elastic-attention lm-eval")
    assert "pip install 'elastic-attention[lm-eval]'" in printed and "example:\n  elastic-attention lm-eval" in printed
    assert main(["lm-eval", "--tasks", "x"]) == 2
    assert "pip install 'elastic-attention[lm-eval]'" in capsys.readouterr().err

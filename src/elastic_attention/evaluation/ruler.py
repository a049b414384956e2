"""RULER as a held-out test: lm-evaluation-harness's own RULER generators and its scoring rule, as a task suite.

The rows come from lm-eval's RULER task functions (the ``lm-eval`` extra pins the version), called with the model's
tokenizer folder at one length, after seeding Python's and NumPy's generators (those functions draw from the global
ones); the first ``n`` rows of the 500 each call makes are kept. A row is the task's ``input`` as the user turn and
its ``gen_prefix`` as the start of the assistant turn (what lm-eval renders with ``--apply_chat_template``), and it is
scored as lm-eval scores it: RULER's ``string_match_all`` after its ``postprocess_pred`` (the share of the expected
strings found in the answer, case-insensitive). The rule is restated here so a machine without lm-eval can score
carried rows (`elastic_attention.evaluation.row_cells`); a test checks it against lm-eval's own function.

Six RULER tasks generate offline (`RULER_TASKS`); the others read data sets that must be downloaded
(`RULER_NOT_RUN`) and are not run. RULER is never a training source: nothing in the library trains on these rows.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import re
from collections.abc import Iterator
from pathlib import Path

from elastic_attention.errors import InputError
from elastic_attention.evaluation.scoring import Score
from elastic_attention.rows import Row

#: The RULER tasks that generate offline: lm-eval task name -> (module of lm_eval.tasks.ruler, function).
RULER_TASKS: dict[str, tuple[str, str]] = {
    "niah_single_1": ("niah_utils", "niah_single_1"),
    "niah_multikey_2": ("niah_utils", "niah_multikey_2"),
    "niah_multikey_3": ("niah_utils", "niah_multikey_3"),
    "ruler_vt": ("vt_utils", "get_vt_dataset"),
    "ruler_cwe": ("cwe_utils", "get_cw_dataset"),
    "ruler_fwe": ("fwe_utils", "fwe_download"),
}

#: The RULER tasks not run, and what each would download.
RULER_NOT_RUN: dict[str, str] = {
    "niah_single_2": "Paul Graham essays (the essay haystack)",
    "niah_single_3": "Paul Graham essays (the essay haystack)",
    "niah_multikey_1": "Paul Graham essays (the essay haystack)",
    "niah_multiquery": "Paul Graham essays (the essay haystack)",
    "niah_multivalue": "Paul Graham essays (the essay haystack)",
    "ruler_qa_squad": "SQuAD",
    "ruler_qa_hotpot": "HotpotQA",
}

#: New tokens per task: the ``max_gen_toks`` of each task's YAML in lm-eval (checked against them by a test).
MAX_NEW_TOKENS: dict[str, int] = {"niah_single_1": 128, "niah_multikey_2": 128, "niah_multikey_3": 128,
                                  "ruler_vt": 30, "ruler_cwe": 120, "ruler_fwe": 50}

#: The extra that brings lm-eval's RULER generators.
EXTRA_HINT = "pip install 'elastic-attention[lm-eval]' (lm-eval with its ruler extra: wonderwords, nltk)"

_CONTROL = re.compile(r"[\x00-\x1f]")


def lm_eval_version() -> str:
    """The installed lm-eval's version, or raise `InputError` naming the extra."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        raise InputError(f"RULER rows are made by lm-evaluation-harness: {EXTRA_HINT}") from None


def check_task(task: str) -> None:
    """Raise `InputError` unless ``task`` is a RULER task that generates offline (naming why the others are not)."""
    if task in RULER_NOT_RUN:
        raise InputError(f"RULER task {task!r} needs {RULER_NOT_RUN[task]}, a download; the offline RULER tasks are "
                         f"{list(RULER_TASKS)}")
    if task not in RULER_TASKS:
        raise InputError(f"unknown RULER task {task!r}; the offline RULER tasks are {list(RULER_TASKS)}")


@contextlib.contextmanager
def no_downloads() -> Iterator[None]:
    """Within: nltk's downloader (which lm-eval's RULER module calls at import for a sentence splitter only the
    essay tasks use) fetches nothing and says so."""
    try:
        import nltk
    except ImportError:
        yield
        return
    original = nltk.download

    def refuse(*args, **kwargs) -> bool:
        return False

    nltk.download = refuse
    try:
        yield
    finally:
        nltk.download = original


def generate(task: str, length: int, seed: int, n: int, tokenizer) -> list[Row]:
    """``n`` rows of a RULER task at ``length`` tokens, made by lm-eval's generator for ``tokenizer``.

    Args:
        task: a name of `RULER_TASKS`.
        length: RULER's ``max_seq_length`` (the prompt plus the task's new tokens stay within it).
        seed: seeds Python's ``random`` and NumPy's global generator before the call.
        n: rows kept (the first ``n`` of the 500 lm-eval makes; at most 500).
        tokenizer: a Hugging Face tokenizer loaded from a local folder (lm-eval loads it again from that folder).

    Returns:
        Rows with the task's input as ``context``, RULER's ``gen_prefix`` as ``assistant_prefix``, ``answer`` the
        expected strings joined by ``", "`` and ``metadata``: ``outputs`` (the expected strings),
        ``max_new_tokens``, ``ruler_length`` (RULER's measured prompt tokens plus new tokens), ``index``,
        ``generator`` (lm-eval and its version), ``seed``.

    Raises:
        InputError: an unknown or download-needing task, a tokenizer not from a local folder, ``n`` over 500, or
            lm-eval missing.
    """
    check_task(task)
    version = lm_eval_version()
    folder = getattr(tokenizer, "name_or_path", "")
    if not folder or not Path(folder).is_dir():
        raise InputError(f"RULER's generators load the tokenizer again by name: give a tokenizer loaded from a local "
                         f"folder (got name_or_path {folder!r})")
    if not 1 <= n <= 500:
        raise InputError(f"RULER's generators make 500 rows a length; asked {n}")
    import numpy

    module_name, function_name = RULER_TASKS[task]
    with no_downloads():
        module = importlib.import_module(f"lm_eval.tasks.ruler.{module_name}")
    random.seed(seed)
    numpy.random.seed(seed)
    dataset = getattr(module, function_name)(max_seq_lengths=[length], tokenizer=folder)["test"]
    rows = []
    for record in dataset.select(range(min(n, len(dataset)))):
        outputs = [str(value) for value in record["outputs"]]
        metadata = {"outputs": outputs, "max_new_tokens": MAX_NEW_TOKENS[task], "ruler_length": int(record["length"]),
                    "index": int(record["index"]), "generator": f"lm-eval {version}", "seed": seed}
        rows.append(Row(context=record["input"], question="", answer=", ".join(outputs), task=task,
                        metadata=metadata, assistant_prefix=record["gen_prefix"]))
    if len(rows) < n:
        raise InputError(f"lm-eval made {len(rows)} rows of {task} at {length}, {n} asked")
    return rows


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred`` for one prediction: stripped, control characters made newlines."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's ``string_match_all`` for one prediction: the share of ``references`` found in it, ignoring case."""
    text = prediction.lower()
    return sum(1.0 for reference in references if reference.lower() in text) / len(references)


def score(prediction: str, row: Row) -> Score:
    """RULER's score of a decoded prediction (exact when every expected string is found)."""
    value = string_match_all(postprocess(prediction), row.metadata["outputs"])
    return Score(value, value == 1.0)

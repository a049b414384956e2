"""No training row of the broad suite shares text with the held-out tests: RULER's templates, needle, noise haystack
and answer prefixes (read from lm-evaluation-harness's own RULER source files, as text, never imported: they need
extra packages), and the code suite's instructions, questions and needle sentences.

Every string literal of those files (docstrings, raised messages and regular expressions left out) is split at its
``{placeholders}``, line breaks and sentence ends into literal fragments; a fragment of 20 characters or more must not
occur in any generated row (instruction, context, question, system turn and answer, case ignored), nor in any
wording template of the suite. RULER's noise sentences are checked one by one whatever their length, and so is the
word pair "special magic".
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from elastic_attention.evaluation import broad_suite, code_suite
from elastic_attention.evaluation.broad_suite import wordings

LM_EVAL = importlib.util.find_spec("lm_eval")
pytestmark = pytest.mark.skipif(LM_EVAL is None, reason="lm_eval is not installed, so RULER's templates cannot be "
                                                        "read; install elastic-attention[lm-eval] to run this test")
MIN_FRAGMENT = 20
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def _literals(tree: ast.Module) -> list[str]:
    """String literals of a module, f-strings with ``{}`` for their fields; docstrings, raised messages and the
    arguments of ``re`` functions left out (messages and patterns, not prompt text)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                                             ast.Constant):
            skipped.add(id(body[0].value))
        is_re_call = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and isinstance(node.func.value, ast.Name) and node.func.value.id == "re")
        if isinstance(node, ast.Raise) or is_re_call:
            skipped.update(id(inner) for inner in ast.walk(node))
    texts = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
            skipped.update(id(part) for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    return texts


def fragments(text: str) -> set[str]:
    """Literal pieces of ``text`` of at least `MIN_FRAGMENT` characters: split at ``{placeholders}`` and line breaks,
    each piece also split into its sentences."""
    found = set()
    for piece in re.split(r"\{[^{}]*\}|\n", text):
        for part in [piece, *re.split(r"(?<=[.?!:;])\s+", piece)]:
            if len(part.strip()) >= MIN_FRAGMENT:
                found.add(part.strip().lower())
    return found


@pytest.fixture(scope="module")
def ruler_fragments() -> set[str]:
    folder = Path(LM_EVAL.submodule_search_locations[0]) / "tasks" / "ruler"
    files = sorted(folder.glob("*.py"))
    assert {"niah_utils.py", "prepare_niah.py", "vt_utils.py", "cwe_utils.py", "fwe_utils.py"} <= {
        path.name for path in files}
    found = {fragment for path in files for text in _literals(ast.parse(path.read_text(encoding="utf-8")))
             for fragment in fragments(text)}
    # The extraction sees the templates it must: the niah template, its needle, the vt / cwe / fwe instructions.
    assert "are hidden within the following text. make sure to memorize it. i will quiz you about the" in found
    assert "one of the special magic" in found and NOISE.lower() in found
    assert "memorize and track the chain(s) of variable assignment hidden in the following text." in found
    assert "below is a numbered list of words." in found
    assert "read the following coded text and track the frequency of each coded word." in found
    return found


@pytest.fixture(scope="module")
def code_suite_fragments() -> set[str]:
    found = {fragment for text in _literals(ast.parse(Path(code_suite.__file__).read_text(encoding="utf-8")))
             for fragment in fragments(text)}
    for instruction in code_suite.INSTRUCTIONS.values():
        assert fragments(instruction) <= found
    assert "what is the secret key stated in the code above?" in found  # the questions are among them
    return found


@pytest.fixture(scope="module")
def training_rows():
    """Rows of every family in both layouts, with and without a system turn, at several lengths and seeds, cut with
    the shipped tiny backbone's tokenizer."""
    from transformers import AutoTokenizer

    from elastic_attention.assets import TINY_BACKBONE

    tokenizer = AutoTokenizer.from_pretrained(TINY_BACKBONE)
    rows = []
    for k, task in enumerate(broad_suite.FAMILIES):
        for j, layout in enumerate(broad_suite.LAYOUTS):
            length = (4096, 7001, 11111)[(k + j) % 3]
            rows += broad_suite.generate(task, length, 100 + j, 1, tokenizer, layout=layout, system=bool((k + j) % 2))
    return rows


def _texts(row) -> str:
    return "\n".join((row.system, row.prompt, row.answer)).lower()


def _assert_clean(text: str, banned: set[str], where: str) -> None:
    hits = sorted(fragment for fragment in banned if fragment in text)
    assert not hits, f"{where} holds held-out text: {hits[:5]}"


def test_no_training_row_holds_ruler_text(training_rows, ruler_fragments):
    sentences = {sentence.lower() for sentence in re.split(r"(?<=\.)\s+", NOISE)}
    assert {row.metadata["layout"] for row in training_rows} == set(broad_suite.LAYOUTS)
    assert {bool(row.system) for row in training_rows} == {True, False}
    for row in training_rows:
        text = _texts(row)
        _assert_clean(text, ruler_fragments, f"a {row.task} row")
        _assert_clean(text, sentences, f"a {row.task} row")
        assert "special magic" not in text


def test_no_training_row_holds_code_suite_text(training_rows, code_suite_fragments):
    for row in training_rows:
        _assert_clean(_texts(row), code_suite_fragments, f"a {row.task} row")


def test_no_wording_template_holds_held_out_text(ruler_fragments, code_suite_fragments):
    templates = [text for table in (wordings.INSTRUCTIONS, wordings.QUESTIONS) for texts in table.values()
                 for text in texts]
    templates += [text for texts in wordings.HINTS.values() for text in texts] + list(wordings.SYSTEM_PROMPTS)
    for template in templates:
        for piece in re.split(r"\{[^{}]*\}", template):
            _assert_clean(piece.lower(), ruler_fragments | code_suite_fragments, repr(template))
            assert "special magic" not in piece.lower()


def test_the_check_catches_a_contaminated_row(training_rows, ruler_fragments, code_suite_fragments):
    row = training_rows[0]
    planted = row.context + "\nOne of the special magic numbers for alpha is: 4.\n"
    with pytest.raises(AssertionError, match="held-out text"):
        _assert_clean(planted.lower(), ruler_fragments, "a planted row")
    with pytest.raises(AssertionError, match="held-out text"):
        _assert_clean((row.context + code_suite.INSTRUCTIONS["passkey"]).lower(), code_suite_fragments, "a row")

"""The broad suite: the length contract at odd lengths under two tokenizers, determinism per (task, length, seed,
index), answers recovered from the context by rules of the test's own (never the generator's bookkeeping), where
the evidence sits, scoring, and the breadth of wordings, layouts, system turns and haystacks; plus the optional
system turn of rows and chat rendering.

A small byte-level BPE tokenizer is trained on part of the snapshot inside the test (a Qwen-like chat template), so
nothing is downloaded; the shipped tiny backbone's word-level tokenizer is the second one.
"""

from __future__ import annotations

import datetime
import json
import re
from collections import Counter

import pytest

from elastic_attention.chat import encode_chat, encode_prompt, render_prompt
from elastic_attention.errors import InputError
from elastic_attention.evaluation import broad_suite
from elastic_attention.evaluation.broad_suite import wordings
from elastic_attention.evaluation.corpus import stdlib_files
from elastic_attention.evaluation.suites import get_suite, suite_of
from elastic_attention.rows import Row, encode_row

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TASKS = tuple(broad_suite.FAMILIES)
ODD_LENGTHS = (4100, 8191)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(("".join(f.lines) for f in stdlib_files()[:40]), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


@pytest.fixture(scope="module")
def rows(tokenizer):
    """One row per family and odd length, each family in both layouts, reused by the tests below."""
    layouts = broad_suite.LAYOUTS
    return {(task, length): broad_suite.generate(task, length, 11, 1, tokenizer, layout=layouts[(k + j) % 2])
            for k, task in enumerate(TASKS) for j, length in enumerate(ODD_LENGTHS)}


def _tokens_after(tokenizer, row: Row, start: int) -> int:
    return len(tokenizer.encode(row.prompt[start:], add_special_tokens=False))


def _letters(text: str) -> str:
    """Letters and digits only, lowercased: ``the Korvath team`` and ``KORVATH_TEAM`` compare equal."""
    return "".join(re.findall(r"[a-z0-9]+", text.lower()))


def _evidence(row: Row) -> list[str]:
    return [row.prompt[start:end] for start, end in row.metadata["evidence_spans"]]


# ---------------------------------------------------------------------------------------------------------------
# Length contract and determinism
# ---------------------------------------------------------------------------------------------------------------


def test_rendered_prompts_meet_the_length_contract_at_odd_lengths(tokenizer, rows):
    tolerance = broad_suite.LENGTH_TOLERANCE_TOKENS
    for (task, length), cell in rows.items():
        for row in cell:
            tokens = len(encode_prompt(tokenizer, row.prompt, row.system))
            assert tokens == row.metadata["prompt_tokens"], task
            assert length - tolerance <= tokens <= length, (task, length, tokens)
            encoded = encode_row(tokenizer, row)  # the answer turn extends the prompt, system turn included
            assert len(encoded.prompt_ids) == tokens and encoded.answer_ids


def test_the_longest_lengths_and_the_shipped_word_level_tokenizer():
    from transformers import AutoTokenizer

    from elastic_attention.assets import TINY_BACKBONE

    word_level = AutoTokenizer.from_pretrained(TINY_BACKBONE)
    for task, length in (("fact_multikey", 32768), ("line_completion", 30001), ("table_lookup", 5003)):
        (row,) = broad_suite.generate(task, length, 2, 1, word_level)
        tokens = len(encode_prompt(word_level, row.prompt, row.system))
        assert length - broad_suite.LENGTH_TOLERANCE_TOKENS <= tokens <= length
        assert all(row.prompt[start:end] for start, end in row.metadata["evidence_spans"])


def test_rows_are_a_pure_function_of_task_length_seed_and_index(tokenizer, rows):
    first = broad_suite.generate("fact_single", 4100, 5, 3, tokenizer)
    assert broad_suite.generate("fact_single", 4100, 5, 3, tokenizer) == first
    assert broad_suite.generate("fact_single", 4100, 5, 2, tokenizer) == first[:2]  # row i does not depend on n
    assert len({row.context for row in first}) == 3 and len({row.answer for row in first}) == 3
    other = broad_suite.generate("fact_single", 4100, 6, 3, tokenizer)  # another epoch's seed: other text
    assert not {row.context for row in other} & {row.context for row in first}
    assert {row.answer for row in other} != {row.answer for row in first}


# ---------------------------------------------------------------------------------------------------------------
# Answers and evidence, checked by rules of the test's own
# ---------------------------------------------------------------------------------------------------------------


def _next_item(items: list[str]) -> str:
    """The next item of a regular sequence, worked out from the items alone."""
    if all(item.isdigit() for item in items):
        step = int(items[1]) - int(items[0])
        assert all(int(b) - int(a) == step for a, b in zip(items, items[1:]))
        return str(int(items[-1]) + step)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", items[0]):
        days = [datetime.date.fromisoformat(item) for item in items]
        return (days[-1] + (days[1] - days[0])).isoformat()
    if re.fullmatch(r"[A-Z]{3}-\d+", items[0]):
        numbers = [int(item.split("-")[1]) for item in items]
        width = len(items[0].split("-")[1])
        return f"{items[0].split('-')[0]}-{numbers[-1] + numbers[1] - numbers[0]:0{width}d}"
    return chr(ord(items[-1][0]) + 1) + items[-1][1:]


def _check_answer(row: Row) -> None:
    """The answer follows from the evidence spans (and the context), by the family's rule."""
    evidence, task, answer = _evidence(row), row.task, row.answer
    if task in ("fact_single", "fact_multikey", "fact_recent", "json_lookup", "table_lookup", "log_lookup",
                "last_record"):
        assert len(evidence) == 1 and re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", evidence[0]), (task, evidence)
    elif task == "fact_multivalue":
        values = row.metadata["values"]
        assert len(evidence) == len(values) and all(any(value in text for text in evidence) for value in values)
    elif task == "two_hop":
        link, fact = sorted(evidence, key=lambda text: answer in text)  # the link does not hold the answer
        assert answer in fact and answer not in link
        assert _letters(row.metadata["relation"]) in _letters(link)
        middle = _letters(row.metadata["middle"].removeprefix("the "))
        assert middle in _letters(link) and middle in _letters(fact)  # both name the middle item
    elif task == "chain_tracking":
        held = {}
        for text in evidence:  # statements in context order: a literal first, then copies
            operands = re.findall(r"\b(?:[A-Z]{2,}|[a-z]+_[a-z_]+|\d+)\b", text)
            assert len(operands) == 2, text
            target, source = operands[::-1] if text.startswith(("Store", "Copy")) else operands
            held[target] = source if source.isdigit() else held[source]
        assert held[row.metadata["chain"][-1]] == answer and len(held) == row.metadata["hops"] + 1
    elif task == "code_definition":
        header, definition = evidence
        assert answer in header and f"def {row.metadata['function']}(" in definition
    elif task == "code_caller":
        (caller,) = evidence
        assert caller.lstrip().startswith(f"def {answer}(") and f"{row.metadata['helper']}(" in caller
    elif task == "mention_count":
        assert len(evidence) == int(answer)
        assert row.context.lower().count(row.metadata["marker"].lower()) == int(answer)
    elif task == "value_aggregate":
        amounts = row.metadata["amounts"]
        assert len(evidence) == len(amounts)
        assert Counter(amounts) == Counter(next(amount for amount in amounts if re.search(
            rf"(?<![\d.]){amount}(?![\d.])", text)) for text in evidence)
        assert answer == str({"sum": sum, "max": max, "min": min}[row.metadata["operation"]](amounts))
    elif task == "sequence_next":
        (block,) = evidence
        assert all(item in block for item in row.metadata["sequence"])
        assert answer == _next_item(row.metadata["sequence"])
    elif task == "line_completion":
        source = next(f for f in stdlib_files() if f.path == row.metadata["file"])
        assert source.lines[row.metadata["line"] - 1].strip() == answer
        assert row.context.endswith(row.metadata["prefix"]) and evidence == [row.metadata["prefix"]]
    elif task == "rule_induction":
        (block,) = evidence
        assert all(re.search(rf"\b{word}\b", block) for word in row.metadata["examples"])
    else:
        raise AssertionError(f"no check for {task}")


@pytest.mark.parametrize("task", TASKS)
def test_answers_follow_from_the_evidence_where_the_kind_says(tokenizer, rows, task):
    kind = broad_suite.FAMILIES[task].kind
    for length in ODD_LENGTHS:
        for row in rows[(task, length)]:
            _check_answer(row)
            starts = [start for start, _ in row.metadata["evidence_spans"]]
            after = [_tokens_after(tokenizer, row, start) for start in starts]
            if kind == "sensitive":  # at least one piece of evidence far outside a 2048-token window
                assert max(after) >= broad_suite.FAR_TOKENS, (task, after)
            else:  # all of it within the last ~700 tokens
                assert max(after) <= broad_suite.RECENT_TOKENS, (task, after)


def test_rule_induction_examples_follow_one_rule():
    from elastic_attention.evaluation.broad_suite.families_local import RULES

    assert RULES["reverse"]("stream") == "maerts" and RULES["shift_one"]("zebra") == "afcsb"
    assert RULES["swap_ends"]("parser") == "rarsep" and RULES["first_last"]("window") == "ww"
    for seed in range(30):
        plan = broad_suite.plan_row("rule_induction", seed)
        rule = RULES[plan.draft.extra["rule"]]
        lines = plan.draft.needles[0].text.splitlines()
        for word in plan.draft.extra["examples"]:
            assert any(re.search(rf"\b{word}\b", line) and re.search(rf"(?<!\w){re.escape(rule(word))}(?!\w)", line)
                       for line in lines), (word, lines)
        assert plan.draft.answer == rule(plan.draft.fields["input"])


# ---------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------


def _wrong(row: Row) -> str:
    kind = row.metadata["answer_kind"]
    if row.metadata["distractors"]:
        return row.metadata["distractors"][0]
    if kind == "number":
        return str(int(row.answer) + 1)
    if kind == "path":
        return "Lib/json/decoder.py" if row.answer != "json/decoder.py" else "Lib/ast.py"
    if kind == "line":
        return row.answer[:-2] + "x:"
    return row.answer[:-1] + ("0" if row.answer[-1] != "0" else "1")


@pytest.mark.parametrize("task", TASKS)
def test_scoring_accepts_the_answer_and_rejects_a_wrong_one(rows, task):
    row = rows[(task, ODD_LENGTHS[0])][0]
    assert broad_suite.score(row.answer, row).exact
    assert broad_suite.score(row.answer, row).accuracy == 1.0
    assert broad_suite.score(f"{row.answer}\n", row).exact
    wrong = broad_suite.score(_wrong(row), row)
    assert not wrong.exact and wrong.accuracy < 1.0
    if row.metadata["answer_kind"] in ("value", "identifier", "number"):
        assert broad_suite.score(f"The answer is {row.answer}.", row).exact


def test_scoring_rules_on_hand_made_rows():
    def row(answer, kind, **metadata):
        return Row("", "q", answer, "fact_single", "", {"answer_kind": kind, **metadata})

    value = row("48213", "value", distractors=["55120"])
    assert broad_suite.score("It is 48213.", value).exact
    assert not broad_suite.score("482130", value).exact
    assert not broad_suite.score("48213 or 55120", value).exact  # naming a distractor too
    assert not broad_suite.score("\nsee below\n48213", value).exact  # the first answer line only
    assert broad_suite.score("Korvath", row("korvath", "value")).exact
    assert not broad_suite.score("MAERTS", row("maerts", "value", case_sensitive=True)).exact
    several = row("Ada Lin, 2031-04-05", "values", values=["Ada Lin", "2031-04-05"], distractors=["Bo Ek"])
    assert broad_suite.score("2031-04-05\nAda Lin", several).exact
    assert not broad_suite.score("Ada Lin", several).exact
    assert not broad_suite.score("Ada Lin, 2031-04-05, Bo Ek", several).exact
    number = row("1974", "number")
    assert broad_suite.score("The total is 1,974.", number).exact and not broad_suite.score("1975", number).exact
    path = row("email/__init__.py", "path")
    assert broad_suite.score("`Lib/email/__init__.py`", path).exact and broad_suite.score("email", path).exact
    assert not broad_suite.score("email/utils.py", path).exact
    assert not broad_suite.score("email.utils", path).exact
    line = row("if not self:", "line")
    assert broad_suite.score("```python\n    if not self:\n```", line).exact
    with pytest.raises(InputError, match="answer_kind"):
        broad_suite.score("x", Row("", "q", "x", "fact_single", "", {}))


# ---------------------------------------------------------------------------------------------------------------
# Breadth
# ---------------------------------------------------------------------------------------------------------------


def test_every_family_has_eight_wordings_and_uses_them_all():
    plans = {task: [broad_suite.plan_row(task, seed) for seed in range(160)] for task in TASKS}
    for task in TASKS:
        assert len(set(wordings.INSTRUCTIONS[task])) >= 8 and len(set(wordings.QUESTIONS[task])) >= 8
        used = Counter((plan.wording["instruction_wording"], plan.wording["question_wording"])
                       for plan in plans[task])
        assert len({i for i, _ in used}) >= 8 and len({q for _, q in used}) >= 8, task
        for plan in plans[task]:
            assert "{" not in plan.framing.instruction and "{" not in plan.framing.question
    layouts = Counter(plan.framing.layout for cell in plans.values() for plan in cell)
    systems = Counter(bool(plan.framing.system) for cell in plans.values() for plan in cell)
    haystacks = Counter(plan.haystack.category for cell in plans.values() for plan in cell)
    formats = {plan.haystack.fmt for cell in plans.values() for plan in cell}
    assert set(layouts) == set(broad_suite.LAYOUTS) and min(layouts.values()) > 0.3 * sum(layouts.values())
    assert set(systems) == {True, False} and min(systems.values()) > 0.3 * sum(systems.values())
    assert set(haystacks) == {"python", "prose", "records", "words"}
    assert formats == {"python", "prose", "words", "csv", "markdown", "jsonl", "json_array", "log"}
    needle_formats = {plan.draft.extra.get("needle_format") for cell in plans.values() for plan in cell}
    assert {"sentence", "comment", "kv", "json", "assignment", "log", "table", "bullet"} <= needle_formats


def test_layouts_and_system_turns_in_the_rows(tokenizer, rows):
    seen = set()
    for cell in rows.values():
        for row in cell:
            layout = row.metadata["layout"]
            seen.add((layout, bool(row.system)))
            if layout == "instruction_first":
                assert row.instruction and row.prompt.startswith(row.instruction + "\n" + row.context)
            else:
                assert not row.instruction and row.prompt.startswith(row.context + "\n")
            assert row.prompt.endswith(row.question)
            rendered = render_prompt(tokenizer, row.prompt, row.system)
            assert (row.system in rendered) if row.system else "<|im_start|>system" not in rendered
    assert seen == {(layout, system) for layout in broad_suite.LAYOUTS for system in (True, False)}
    forced = broad_suite.generate("last_record", 4100, 1, 2, tokenizer, layout="instruction_last", system=True)
    assert all(row.metadata["layout"] == "instruction_last" and row.system for row in forced)


def test_the_suite_is_registered_and_trainable():
    from elastic_attention.training.train_config import SUITE_SOURCES, TrainConfig

    config = TrainConfig.from_dict({"model": "m", "targets": broad_suite.expected_targets(),
                                    "data": {"source": "broad", "tasks": list(TASKS), "lengths": [4096, 8192]}})
    assert config.data.source == "broad" and set(config.targets) == set(TASKS)
    broad = get_suite("broad")
    assert broad.tasks == TASKS and len(TASKS) >= 12
    assert broad.kind("fact_single") == "sensitive" and broad.kind("rule_induction") == "robust"
    assert suite_of("chain_tracking") is broad and SUITE_SOURCES["broad"] == "broad"
    assert set(broad_suite.expected_targets()) == set(TASKS)
    assert set(broad.resolve(["robust"])) == set(broad_suite.ROBUST_TASKS)


def test_generate_refuses_bad_arguments(tokenizer):
    with pytest.raises(InputError, match="tokenizer"):
        broad_suite.generate("fact_single", 4096, 0, 1)
    with pytest.raises(InputError, match="length"):
        broad_suite.generate("fact_single", 2048, 0, 1, tokenizer)
    with pytest.raises(InputError, match="one of"):
        broad_suite.generate("passkey", 4096, 0, 1, tokenizer)
    with pytest.raises(InputError, match="layout"):
        broad_suite.generate("fact_single", 4096, 0, 1, tokenizer, layout="middle")


# ---------------------------------------------------------------------------------------------------------------
# The optional system turn of rows
# ---------------------------------------------------------------------------------------------------------------


def test_a_system_turn_is_rendered_before_the_user_turn_and_absent_by_default(tokenizer):
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                          add_generation_prompt=True)
    assert render_prompt(tokenizer, "hi") == plain  # callers without a system text see no change
    assert render_prompt(tokenizer, "hi", "Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n" + plain
    prompt_ids, answer_ids = encode_chat(tokenizer, "hi", "yes", "Be brief.")
    assert tokenizer.decode(prompt_ids + answer_ids).startswith("<|im_start|>system\nBe brief.")
    assert encode_row(tokenizer, Row("c", "q", "a", "t", system="Be brief.")).prompt_ids == encode_prompt(
        tokenizer, "c\nq", "Be brief.")


def test_a_template_without_a_system_role_is_refused_with_the_fix(tokenizer):
    import copy

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}"
                            "{% endif %}" + CHAT_TEMPLATE)
    with pytest.raises(InputError, match="system=False"):
        render_prompt(strict, "hi", "Be brief.")
    assert render_prompt(strict, "hi")


def test_row_files_carry_the_system_turn(tmp_path):
    from elastic_attention.training.data import load_rows

    path = tmp_path / "rows.jsonl"
    records = [{"context": "c", "question": "q", "answer": "a", "task": "t", "system": "Be brief."},
               {"context": "c", "question": "q", "answer": "a", "task": "t"}]
    path.write_text("\n".join(json.dumps(record) for record in records))
    with_system, without = load_rows(path)
    assert with_system.system == "Be brief." and without.system == ""
    path.write_text(json.dumps({**records[0], "system": 3}))
    with pytest.raises(InputError, match="`system` must be a string"):
        load_rows(path)

"""The code suite: lengths, determinism, answers recoverable from their contexts, scoring, evidence positions.

The rows are cut in a tokenizer's tokens; these tests train a small byte-level BPE tokenizer on part of the
snapshot (a chat template like Qwen's), so they need no downloaded model. Each answer is recovered from the context
by an independent rule (a regex or a walk over the assignments), never by the generator's own bookkeeping.
"""

from __future__ import annotations

import re

import pytest

from elastic_attention.chat import encode_prompt
from elastic_attention.errors import InputError
from elastic_attention.evaluation import code_suite
from elastic_attention.evaluation.corpus import stdlib_files
from elastic_attention.evaluation.head_ranking import evidence_positions
from elastic_attention.evaluation.scoring import edit_similarity, first_answer_line, first_integer
from elastic_attention.evaluation.suites import get_suite, suite_of
from elastic_attention.rows import Row, encode_row

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


@pytest.mark.parametrize("task", code_suite.TASKS)
@pytest.mark.parametrize("length", [1024, 1777, 6000])
def test_rendered_prompts_meet_the_length_contract(tokenizer, task, length):
    for row in code_suite.generate(task, length, 3, 2, tokenizer):
        tokens = len(encode_prompt(tokenizer, row.prompt))
        assert tokens == row.metadata["prompt_tokens"]
        assert length - code_suite.LENGTH_TOLERANCE_TOKENS <= tokens <= length
        assert row.prompt.startswith(code_suite.INSTRUCTIONS[task]) and row.prompt.endswith(row.question)


def test_rows_are_deterministic_and_differ_between_samples(tokenizer):
    first = code_suite.generate("passkey", 2048, 5, 3, tokenizer)
    again = code_suite.generate("passkey", 2048, 5, 3, tokenizer)
    assert first == again
    assert len({row.answer for row in first}) == 3 and len({row.context for row in first}) == 3
    assert code_suite.generate("passkey", 2048, 6, 1, tokenizer)[0] != first[0]


def _tokens_after(tokenizer, row, char_offset: int) -> int:
    return len(tokenizer.encode(row.prompt[char_offset:], add_special_tokens=False))


def test_passkey_and_multikey_answers_are_in_the_far_context(tokenizer):
    for row in code_suite.generate("passkey", 8192, 0, 4, tokenizer):
        found = re.findall(r"# The secret key is (\d{6})\. Remember it\.", row.context)
        assert found == [row.answer]
        # Sensitive evidence sits in the first three quarters: far outside a 1024-token window before the question.
        assert _tokens_after(tokenizer, row, row.prompt.index(found[0])) > 1500
    for row in code_suite.generate("multikey", 8192, 0, 4, tokenizer):
        project = re.search(r"secret key of the (\w+) project\?", row.question).group(1)
        keys = dict(re.findall(r"# The secret key of the (\w+) project is (\d{6})\.", row.context))
        assert len(keys) == 4 and keys[project] == row.answer and len(set(keys.values())) == 4


def test_find_definition_answer_is_the_default_in_the_only_definition(tokenizer):
    rows = code_suite.generate("find_definition", 4096, 0, 6, tokenizer)
    rows += code_suite.generate("recent_definition", 4096, 0, 6, tokenizer)
    for row in rows:
        function = re.search(r"the function `(\w+)`", row.question).group(1)
        parameter = re.search(r"parameter `(\w+)`", row.question).group(1)
        quoted = re.search(r"is defined as `([^`]*)\.\.\.`", row.question)
        assert (quoted is None) == (row.task == "find_definition")  # asked plainly; the recent one quotes the line
        if quoted:
            assert quoted.group(1).endswith("=") and row.answer not in quoted.group(1)
        definitions = [m.start() for m in re.finditer(rf"\bdef {function}\(", row.context)]
        assert len(definitions) == 1
        signature = row.context[definitions[0] : row.context.index(":\n", definitions[0])]
        assert re.search(rf"\b{parameter}\s*(?::[^=,]+)?=\s*(\d+)", signature).group(1) == row.answer
        assert int(row.answer) != row.metadata["original_default"]


def test_multivalue_keys_are_the_asked_constants(tokenizer):
    for row in code_suite.generate("multivalue", 6000, 0, 6, tokenizer):
        asked = re.findall(r"`(\w+_SECRET_KEY_\d)`", row.question)
        assert len(asked) == 2
        keys = [re.findall(rf"^{name} = (\d{{6}})$", row.context, flags=re.M) for name in asked]
        assert all(len(found) == 1 for found in keys)  # each constant assigned exactly once
        keys = [found[0] for found in keys]
        assert keys == row.metadata["keys"] and len(set(keys)) == 2
        assert row.answer == ", ".join(row.metadata["keys"])
        assert all(0.05 <= depth <= 0.8 for depth in row.metadata["depths"])


def test_next_line_answer_is_the_real_line_after_the_context(tokenizer):
    for row in code_suite.generate("next_line", 4096, 0, 6, tokenizer):
        source = next(f for f in stdlib_files() if f.path == row.metadata["file"])
        line = source.lines[row.metadata["line"] - 1]
        assert line.strip() == row.answer
        assert row.context.endswith(row.metadata["prefix"]) and row.answer.startswith(row.metadata["prefix"].strip())
        preceding = "".join(source.lines[max(0, row.metadata["line"] - 6) : row.metadata["line"] - 1])
        assert preceding.rstrip("\n") in row.context


def test_robust_evidence_is_near_the_end(tokenizer):
    for row in code_suite.generate("recent_fact", 8192, 0, 4, tokenizer):
        match = re.search(r"# Note: the build number of this module is (\d{5})\.", row.context)
        assert match.group(1) == row.answer
        assert _tokens_after(tokenizer, row, len(row.instruction) + 1 + match.start()) < 900
    for row in code_suite.generate("recent_definition", 8192, 0, 4, tokenizer):
        start = row.context.index(f"def {row.metadata['function']}(")
        assert _tokens_after(tokenizer, row, len(row.instruction) + 1 + start) < 900


def test_pattern_answer_follows_the_rule_of_the_examples_near_the_end(tokenizer):
    for row in code_suite.generate("pattern", 6000, 0, 6, tokenizer):
        function, argument = re.search(r'`(tag_\w+)\("(\w+)"\)`', row.question).groups()
        examples = re.findall(rf'^assert {function}\("(\w+)"\) == "(\w+)/(\w+)/(\d{{3}})"$', row.context, flags=re.M)
        assert len(examples) == 4 and argument not in [word for word, *_ in examples]
        assert all(word == middle for word, _, middle, _ in examples)  # the argument sits between prefix and number
        rules = {(prefix, number) for _, prefix, _, number in examples}
        assert len(rules) == 1  # one rule per row, so the answer follows from the examples
        prefix, number = rules.pop()
        assert row.answer == f"{prefix}/{argument}/{number}"
        start = row.context.index(f"assert {function}(")
        assert _tokens_after(tokenizer, row, len(row.instruction) + 1 + start) < 900


def test_scoring_against_hand_computed_cases():
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert edit_similarity("", "") == 1.0 and edit_similarity("abc", "") == 0.0
    assert first_integer("The key is 0421, not 7.") == "0421" and first_integer("none") is None
    assert first_answer_line("```python\n    x = 1\n```") == "x = 1"
    row = Row("", "q", "482913", "passkey", "i", {})
    assert code_suite.score("The secret key is 482913.", row).exact
    assert not code_suite.score("482914", row).exact
    line = Row("", "q", "x = f(a)", "next_line", "i", {})
    scored = code_suite.score("```python\nx = f(b)\n```", line)
    assert scored.accuracy == pytest.approx(1 - 1 / 8) and not scored.exact
    keys = Row("", "q", "482913, 105577", "multivalue", "i", {"keys": ["482913", "105577"]})
    assert code_suite.score("105577, 482913", keys).exact
    assert not code_suite.score("482913", keys).exact
    assert not code_suite.score("482913, 105577, 777777", keys).exact
    assert code_suite.score("AMBER_SECRET_KEY_1 = 482913, AMBER_SECRET_KEY_2 = 105577", keys).exact
    assert not code_suite.score("AMBER_SECRET_KEY_1 = 482913", keys).exact
    tag = Row("", "q", "ember/record/482", "pattern", "i", {})
    assert code_suite.score('"ember/record/482"', tag).exact
    assert code_suite.score('assert tag_amber("record") == "ember/record/482"', tag).exact
    assert code_suite.score("```\nember/record/482\n```", tag).exact
    assert not code_suite.score("ember/record/4821", tag).exact
    assert not code_suite.score("xember/record/482", tag).exact
    assert not code_suite.score("ember/record/482/1", tag).exact
    assert not code_suite.score("amber/record/482", tag).exact
    assert not code_suite.score("\nsee below\nember/record/482", tag).exact  # the first answer line only


def test_evidence_positions_cover_the_needle_tokens(tokenizer):
    row = code_suite.generate("passkey", 2048, 1, 1, tokenizer)[0]
    prompt_ids = encode_row(tokenizer, row).prompt_ids
    positions = evidence_positions(tokenizer, row, prompt_ids)
    assert positions == list(range(positions[0], positions[-1] + 1))
    text = tokenizer.decode([prompt_ids[p] for p in positions])
    assert f"# The secret key is {row.answer}. Remember it." in text and len(text) < 60


def test_suites_resolve_their_own_tasks_and_refuse_others():
    code = get_suite("code")
    assert code.resolve(["robust"]) == ["next_line", "recent_fact", "recent_definition", "pattern"]
    assert code.kind("passkey") == "sensitive" and suite_of("next_line") is code
    assert suite_of("needle_single").name == "synthetic"
    with pytest.raises(InputError, match="unknown code suite tasks"):
        code.resolve(["needle_single"])
    with pytest.raises(InputError, match="unknown suite"):
        get_suite("books")


def test_generate_refuses_bad_arguments(tokenizer):
    with pytest.raises(InputError, match="tokenizer"):
        code_suite.generate("passkey", 2048, 0, 1)
    with pytest.raises(InputError, match="length"):
        code_suite.generate("passkey", 512, 0, 1, tokenizer)
    with pytest.raises(InputError, match="one of"):
        code_suite.generate("needle", 2048, 0, 1, tokenizer)
    with pytest.raises(InputError, match="num_keys"):
        code_suite.generate("multikey", 2048, 0, 1, tokenizer, num_keys=1)
    with pytest.raises(InputError, match="num_examples"):
        code_suite.generate("pattern", 2048, 0, 1, tokenizer, num_examples=9)

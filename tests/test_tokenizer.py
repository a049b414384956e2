"""Tests of the suite's word-level tokenizer: save/reload, round trips, chat template, no unknown tokens."""

from __future__ import annotations

import pytest

from elastic_attention.rows import Row, encode_row
from elastic_attention.evaluation.synthetic import TASKS, generate
from elastic_attention.evaluation.synthetic.tokenizer import (
    CHAT_PROMPT_OVERHEAD_TOKENS,
    build_tokenizer,
    decode_answer,
    render_answer,
    render_prompt,
)
from elastic_attention.evaluation.synthetic.words import (
    ASSISTANT_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    UNK_TOKEN,
    USER_TOKEN,
    vocabulary,
)

transformers = pytest.importorskip("transformers")


def _ids(tokenizer, row: Row) -> tuple[list[int], list[int]]:
    encoded = encode_row(tokenizer, row)
    return encoded.prompt_ids, encoded.answer_ids


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def reloaded(tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(directory)
    assert (directory / "tokenizer.json").is_file()
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return [row for task in TASKS for length in (256, 512, 2000) for row in generate(task, length, 4, 2)]


def normalized(text: str) -> str:
    return " ".join(text.split())


def test_special_tokens_and_size(tokenizer) -> None:
    assert tokenizer.pad_token == PAD_TOKEN and tokenizer.pad_token_id == 0
    assert tokenizer.unk_token == UNK_TOKEN
    assert tokenizer.bos_token == BOS_TOKEN
    assert tokenizer.eos_token == EOS_TOKEN
    assert {USER_TOKEN, ASSISTANT_TOKEN} <= set(tokenizer.all_special_tokens)
    assert len(tokenizer) == len(vocabulary()) <= 1024
    assert tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) == list(vocabulary())


def test_reload_keeps_vocabulary_specials_and_template(tokenizer, reloaded) -> None:
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert reloaded.chat_template == tokenizer.chat_template
    for name in ("pad_token_id", "unk_token_id", "bos_token_id", "eos_token_id"):
        assert getattr(reloaded, name) == getattr(tokenizer, name)


def test_round_trip_of_prompts_and_answers(reloaded, rows) -> None:
    for row in rows:
        for text in (render_prompt(reloaded, row), row.answer, row.prompt):
            ids = reloaded.encode(text, add_special_tokens=False)
            assert normalized(reloaded.decode(ids)) == normalized(text)


def test_no_unknown_tokens(reloaded, rows) -> None:
    for row in rows:
        prompt_ids, answer_ids = _ids(reloaded, row)
        assert reloaded.unk_token_id not in prompt_ids + answer_ids, row.task


def test_rendered_prompt_length_in_tokens(reloaded, rows) -> None:
    for row in rows:
        prompt_ids, _ = _ids(reloaded, row)
        assert len(prompt_ids) == row.metadata["length"]
        assert len(prompt_ids) == CHAT_PROMPT_OVERHEAD_TOKENS + len(row.prompt.split())
        # encode() adds nothing: the template writes <bos> itself
        assert reloaded.encode(render_prompt(reloaded, row)) == prompt_ids


def test_chat_template_renders_prompt_with_generation_prompt(reloaded) -> None:
    row = generate("needle_single", 512, 0, 1)[0]
    rendered = render_prompt(reloaded, row)
    words = rendered.split()
    assert words[:2] == [BOS_TOKEN, USER_TOKEN]
    assert words[-1] == ASSISTANT_TOKEN
    assert normalized(rendered) == normalized(f"{BOS_TOKEN} {USER_TOKEN} {row.prompt} {ASSISTANT_TOKEN}")
    without_generation_prompt = reloaded.apply_chat_template(
        [{"role": "user", "content": row.prompt}], tokenize=False, add_generation_prompt=False
    )
    assert without_generation_prompt.split() == words[:-1]


def test_answer_continuation_matches_full_conversation(reloaded, rows) -> None:
    for row in rows[:: len(rows) // 7]:
        conversation = [{"role": "user", "content": row.prompt}, {"role": "assistant", "content": row.answer}]
        full = reloaded.apply_chat_template(conversation, tokenize=False)
        assert normalized(full) == normalized(render_prompt(reloaded, row) + render_answer(reloaded, row))
        prompt_ids, answer_ids = _ids(reloaded, row)
        assert reloaded.encode(full, add_special_tokens=False) == prompt_ids + answer_ids
        assert answer_ids[-1] == reloaded.eos_token_id


def test_instruction_and_question_within_100_tokens(reloaded, rows) -> None:
    for row in rows:
        prompt_ids, _ = _ids(reloaded, row)
        first = reloaded.decode(prompt_ids[:100])
        last = reloaded.decode(prompt_ids[-100:])
        assert normalized(row.instruction) in normalized(first)
        assert normalized(row.question) in normalized(last)


def test_decode_answer_stops_at_eos_and_drops_specials(reloaded) -> None:
    row = generate("needle_multivalue", 512, 0, 1)[0]
    _, answer_ids = _ids(reloaded, row)
    junk = reloaded.encode("k1 v2 .", add_special_tokens=False)
    assert decode_answer(reloaded, answer_ids + junk) == row.answer
    assert decode_answer(reloaded, answer_ids[:-1]) == row.answer
    assert decode_answer(reloaded, [reloaded.pad_token_id]) == ""

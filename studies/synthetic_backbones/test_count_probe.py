"""count_probe.py's data: every supervised answer is the true count (and list) of the asked colour."""

from __future__ import annotations

import pytest

import count_probe


@pytest.fixture(scope="module")
def probe():
    return count_probe


@pytest.mark.parametrize("question", ["mid", "last", "list"])
def test_answers_are_recounted_from_the_paragraph(probe, question):
    """Oracle: re-read each paragraph's colour sentences and the asked colour from the words themselves."""
    from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer
    from elastic_attention.evaluation.synthetic.words import PARAGRAPH_MARKER

    ids = build_tokenizer().get_vocab()
    words_of = {index: word for word, index in ids.items()}
    checked = 0
    for seed in range(6):
        input_ids, labels, answer_ids = probe.count_sequence(seed, 301, ids, probe.QUESTIONS[question])
        words = [words_of[i] for i in input_ids]
        for answer in sorted(set(answer_ids) - {-1}):
            positions = [t for t, owner in enumerate(answer_ids) if owner == answer]
            assert all(labels[t] == input_ids[t] for t in positions)
            start = max(t for t in range(positions[0]) if words[t] == PARAGRAPH_MARKER)
            question_at = max(t for t in range(positions[0]) if words[t] == "question")
            asked = words[question_at:positions[0]][words[question_at:positions[0]].index("color") + 1]
            nouns = [words[t + 4] for t in range(start, question_at - 3)
                     if words[t : t + 3] == ["there", "is", "a"] and words[t + 3] == asked]
            expected = (nouns if question == "list" else []) + [str(len(nouns))]
            assert [words[t] for t in positions] == expected and 1 <= len(nouns) <= 4
            checked += 1
    assert checked > 10

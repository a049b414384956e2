"""Head ranking finds a row's evidence tokens whatever comes before the user turn (a system turn)."""

from __future__ import annotations

import dataclasses

from transformers import AutoTokenizer

from elastic_attention.assets import TINY_BACKBONE
from elastic_attention.evaluation.head_ranking import _span_positions
from elastic_attention.evaluation.suites import get_suite
from elastic_attention.rows import encode_row


def test_evidence_positions_move_with_a_system_turn():
    tokenizer = AutoTokenizer.from_pretrained(TINY_BACKBONE)
    row = get_suite("broad").generate("fact_single", 4100, 0, 1, tokenizer, system=False)[0]
    plain_ids = encode_row(tokenizer, row).prompt_ids
    plain = _span_positions(tokenizer, row, plain_ids)
    with_system = dataclasses.replace(row, system="Answer briefly.")
    system_ids = encode_row(tokenizer, with_system).prompt_ids
    shift = len(system_ids) - len(plain_ids)
    assert shift > 0 and plain
    assert _span_positions(tokenizer, with_system, system_ids) == [position + shift for position in plain]
    assert [system_ids[p] for p in _span_positions(tokenizer, with_system, system_ids)] == [plain_ids[p] for p in plain]

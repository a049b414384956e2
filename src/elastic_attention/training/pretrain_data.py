"""Pretraining data: step batches of suite rows and dense needle sequences over the synthetic suite's words.

Every step holds about ``data.tokens_per_step`` tokens as sequences of one length (see `PretrainData`). Each
sequence is, with probability ``data.suite_fraction``, one suite row in the evaluation format (chat template, task
drawn uniformly, prompt of ``L - 16`` tokens, loss on the answer and ``<eos>``, right-padded with ``<pad>``) or
else a dense needle sequence (:func:`dense_needle_sequence`: filler with needles whose echoed keys and queried
values are supervised, variable chains, local count and pattern paragraphs): the dense supervision that makes key
matching learnable. All sequences of a step have the same length, so there is no packing and no attention mask:
right padding sits after every supervised token, which causal attention never lets earlier positions see.

A batch is a deterministic function of (seed, step) (:class:`StepBatches`), so a resumed run replays the data of
the uninterrupted one, and the stream is the one ``scripts/pretrain_backbone.py`` trained the shipped backbones on
(``git show d96b3c3:scripts/pretrain_backbone.py``; pinned in ``tests/test_pretrain.py``). A rate of 0 draws
nothing from the random source: the streams of runs before a feature keep their data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from elastic_attention.errors import InputError
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.evaluation.synthetic import TASKS, count_question, pattern_question
from elastic_attention.evaluation.synthetic.filler import filler_sentence
from elastic_attention.evaluation.synthetic.words import (
    COLOR_WORDS,
    KEY_TOKENS,
    NEEDLE_MARKER,
    PARAGRAPH_MARKER,
    QUERY_MARKER,
    SEQUENCE_MARKER,
    SHARED_NOUNS,
    VALUE_TOKENS,
    VARIABLE_MARKER,
    VARIABLE_TOKENS,
    filler_words,
)
from elastic_attention.rows import encode_row
from elastic_attention.training.data import IGNORE_INDEX
from elastic_attention.training.pretrain_config import PretrainData

#: Tokens kept free after a suite row's prompt for its answer and ``<eos>``.
ANSWER_RESERVE_TOKENS = 16
#: Sequence lengths after the length warm-up are ``min_len`` plus multiples of this.
LENGTH_QUANTUM = 128
FILLER_WORDS = filler_words()
CHAIN_QUERY_MARKER = "hold"  # "hold s t ." : which variable was assigned s (dense pretraining sequences only)


def pretrain_seed(*parts: Any) -> int:
    """A 64-bit seed from SHA-256 of the parts, in a namespace ("pretrain|...") apart from the suite's own seeds."""
    text = "|".join(["pretrain", *(str(part) for part in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def sequence_length(step: int, data: PretrainData, seed: int) -> int:
    """Tokens of every sequence of ``step``: the warm-up length, then uniform ``min_len + 128 k`` up to the max."""
    if step < data.length_warmup_steps:
        return data.warmup_len
    choices = (data.max_len - data.min_len) // LENGTH_QUANTUM
    return data.min_len + LENGTH_QUANTUM * SampleRandom(pretrain_seed("length", seed, step)).integer(0, choices)


@dataclass
class _DenseSequence:
    """A dense needle sequence as it is drawn: its words, the positions whose tokens are supervised, and what later
    segments draw from. Every method draws from ``rng`` in the order the stream was first measured in."""

    keys: list[str]  #: needle keys not yet used (taken from the end)
    variables: list[str]  #: variables not yet assigned (taken from the end)
    colors: list[str]  #: colours not yet used by a count block
    words: list[str] = field(default_factory=list)
    supervised: list[int] = field(default_factory=list)
    stored: list[tuple[str, str]] = field(default_factory=list)  #: needles written, (key, value)
    spans: list[list[str]] = field(default_factory=list)  #: random filler spans written, for repeats
    open_targets: list[str] = field(default_factory=list)  #: assigned variables not yet used as a source
    assignments: list[tuple[str, str]] = field(default_factory=list)  #: (source, target)
    used_values: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, rng: SampleRandom, shuffle_colors: bool) -> _DenseSequence:
        keys, variables, colors = list(KEY_TOKENS), list(VARIABLE_TOKENS), list(COLOR_WORDS)
        rng.shuffle(keys)
        rng.shuffle(variables)
        if shuffle_colors:  # no draw without local blocks: the default stream stays as measured
            rng.shuffle(colors)
        return cls(keys=keys, variables=variables, colors=colors)

    def add(self, segment: list[str], supervised=()) -> None:
        """Append ``segment``; ``supervised`` are offsets into it."""
        self.supervised += [len(self.words) + offset for offset in supervised]
        self.words += segment

    def write_needle(self, rng: SampleRandom, echo_rate: float) -> None:
        """``remember k v .`` with a fresh key, or ``remember k v k .`` (the echo supervised)."""
        key, value = self.keys.pop(), rng.choice(VALUE_TOKENS)
        self.stored.append((key, value))
        echo = echo_rate > 0 and rng.fraction() < echo_rate  # no draw at 0: the default stream stays as measured
        self.add([NEEDLE_MARKER, key, value, key, "."] if echo else [NEEDLE_MARKER, key, value, "."],
                 supervised=[3] if echo else [])

    def write_assignment(self, rng: SampleRandom, echo_rate: float) -> None:
        """``VAR t = s .``: a fresh variable ``t`` from a fresh value or, half the time, from an open target."""
        target = self.variables.pop()
        if self.open_targets and rng.fraction() < 0.5:
            source = self.open_targets.pop(rng.below(len(self.open_targets)))
        else:
            source = rng.choice([value for value in VALUE_TOKENS if value not in self.used_values])
            self.used_values.add(source)
        self.open_targets.append(target)
        self.assignments.append((source, target))
        echo = echo_rate > 0 and rng.fraction() < echo_rate
        self.add([VARIABLE_MARKER, target, "=", source] + ([target, "."] if echo else ["."]),
                 supervised=[4] if echo else [])

    def write_filler(self, rng: SampleRandom, repeat_rate: float) -> None:
        """A repeat of an earlier random span (its second to last tokens supervised), a new random span, or a filler
        sentence (a paragraph marker before one in eight)."""
        draw = rng.fraction() if repeat_rate > 0 else 1.0  # no extra draw: the default stream stays as measured
        if draw < repeat_rate and self.spans:
            span = rng.choice(self.spans)
            self.add(span, supervised=range(1, len(span)))
        elif draw < 2 * repeat_rate:
            span = [rng.choice(FILLER_WORDS) for _ in range(rng.integer(8, 16))] + ["."]
            self.spans.append(span)
            self.add(span)
        else:
            if rng.below(8) == 0:
                self.words.append(PARAGRAPH_MARKER)
            self.add(filler_sentence(rng, rng.integer(6, 15)))


def dense_needle_sequence(
    rng: SampleRandom,
    length: int,
    ids: dict[str, int],
    needle_rate: float = 0.2,
    query_rate: float = 0.2,
    repeat_rate: float = 0.0,
    echo_rate: float = 0.0,
    chain_rate: float = 0.0,
    local_rate: float = 0.0,
    ask_every_color: bool = False,
) -> tuple[list[int], list[int]]:
    """Filler with many needles and inline queries; every queried value is supervised.

    Needles are ``remember k v .`` with a fresh key each (at most 200 per sequence); queries are ``ask k v .`` for a
    uniformly chosen earlier needle, so query distances span the whole sequence. With probability ``repeat_rate`` a
    filler slot holds a new span of 8-16 random filler words, and with the same probability it repeats an earlier
    span verbatim, supervising its second to last tokens: a dense copy signal that bootstraps the induction circuit
    (find the earlier occurrence of the current token, emit what followed it) that the needle lookup needs.

    With probability ``echo_rate`` a needle is written ``remember k v k .`` and its second ``k`` is supervised:
    predicting it from the value's position needs a previous-token head that writes the key into the value's
    residual stream, which is the feature the lookup from ``ask k`` matches against. Without this first-order
    signal the model sits on the plateau of "some stored value" (accuracy about 1 / number of stored needles).

    With probability ``chain_rate`` a segment is a variable assignment ``VAR t = s .`` (``t`` a fresh variable, ``s``
    a fresh value or, half the time, an earlier target not yet used as a source, so assignments form chains as in
    variable_tracking), and with the same probability a reverse query ``hold s t .`` of an earlier assignment, with
    ``t`` supervised: one hop of the variable_tracking answer. Assignments echo their target (``VAR t = s t .``, the
    repeat supervised) with probability ``echo_rate``.

    With probability ``local_rate`` a segment is a local block in the format of the robust tasks' last paragraph: a
    new paragraph of filler sentences with either colour sentences and the local_count question (``question : how
    many times does the color c appear in the last paragraph ? n``, ``n`` supervised; the block's colours are fresh
    in the sequence), or a periodic ``sequence : ...`` with the local_pattern question (every item from the second
    period on and the answer supervised). Counting and continuing get a dense signal instead of one suite answer in
    fourteen sequences.

    Args:
        rng: random source.
        length: tokens.
        ids: word -> token id.
        needle_rate: probability that the next segment is a needle (else a query or a filler sentence).
        query_rate: probability that the next segment is a query.
        repeat_rate: probability that a filler slot starts a random span, and again that it repeats one.
        echo_rate: probability that a needle repeats its key after the value (the repeat is supervised).
        chain_rate: probability that a segment is a variable assignment, and again that it is a reverse query.
        local_rate: probability that a segment is a local count or pattern block.
        ask_every_color: a count block asks about each of its colours (see :func:`local_block`).

    Returns:
        ``(input_ids, labels)``, each ``length`` long; labels are ``IGNORE_INDEX`` except at queried values and
        variables, repeated span tokens, echoed keys and variables, and the answers and continued items of local
        blocks.
    """
    sequence = _DenseSequence.start(rng, shuffle_colors=local_rate > 0)
    while len(sequence.words) < length:
        draw = rng.fraction()
        if draw < needle_rate and sequence.keys:
            sequence.write_needle(rng, echo_rate)
        elif draw < needle_rate + query_rate and sequence.stored:
            key, value = rng.choice(sequence.stored)
            sequence.add([QUERY_MARKER, key, value, "."], supervised=[2])
        elif chain_rate > 0 and draw < needle_rate + query_rate + chain_rate and sequence.variables:
            sequence.write_assignment(rng, echo_rate)
        elif chain_rate > 0 and draw < needle_rate + query_rate + 2 * chain_rate and sequence.assignments:
            source, target = rng.choice(sequence.assignments)
            sequence.add([CHAIN_QUERY_MARKER, source, target, "."], supervised=[2])
        elif local_rate > 0 and draw < needle_rate + query_rate + 2 * chain_rate + local_rate:
            block, answers = local_block(rng, sequence.colors, ask_every_color)
            sequence.add(block, supervised=answers)
        else:
            sequence.write_filler(rng, repeat_rate)
    words, supervised = sequence.words, sequence.supervised
    input_ids = [ids[word] for word in words[:length]]
    labels = [IGNORE_INDEX] * length
    for position in supervised:
        if position < length:
            labels[position] = input_ids[position]
    return input_ids, labels


def local_block(rng: SampleRandom, colors: list[str], ask_every_color: bool = False) -> tuple[list[str], list[int]]:
    """A paragraph in the format of local_count (while ``colors`` has fresh colours, half the time) or local_pattern.

    Args:
        rng: random source.
        colors: colours not yet used in the sequence; a count block takes its colours from the end.
        ask_every_color: a count block asks the count of each of its colours in turn (question, answer, ``.``), not
            of one: questions about different colours over the same sentences can only be told apart by matching
            the asked colour, which counting all colour sentences does not.

    Returns:
        ``(words, supervised)``: the block, and the offsets in it of the tokens to supervise.
    """
    fillers = [filler_sentence(rng, rng.integer(6, 15)) for _ in range(rng.integer(0, 4))]
    if len(colors) >= 3 and rng.fraction() < 0.5:
        block_colors = [colors.pop() for _ in range(rng.integer(1, 3))]
        counts = {color: rng.integer(1, 4) for color in block_colors}
        segments = [["there", "is", "a", color, rng.choice(SHARED_NOUNS), "."] for color in block_colors
                    for _ in range(counts[color])]
        rng.shuffle(segments)
        if ask_every_color:
            asked_colors = list(block_colors)
            rng.shuffle(asked_colors)
        else:
            asked_colors = [rng.choice(block_colors)]
        questions = [count_question(color).split() + [str(counts[color]), "."] for color in asked_colors]
        continued: list[int] = []
    else:
        period = rng.integer(2, 4)
        cycle = rng.sample(VALUE_TOKENS, period)
        shown = rng.integer(2 * period, 4 * period)
        segments = [[SEQUENCE_MARKER, ":", *(cycle[i % period] for i in range(shown)), "."]]
        questions = [pattern_question(1).split() + [cycle[shown % period], "."]]
        continued = list(range(2 + period, 2 + shown))  # offsets in the sequence segment
    gaps = sorted(rng.below(len(fillers) + 1) for _ in segments)
    words, supervised, cursor = [PARAGRAPH_MARKER], [], 0
    for segment, gap in zip(segments, gaps):
        for sentence in fillers[cursor:gap]:
            words += sentence
        cursor = gap
        supervised += [len(words) + offset for offset in continued]
        words += segment
    for sentence in fillers[cursor:]:
        words += sentence
    for question in questions:
        supervised.append(len(words) + len(question) - 2)
        words += question
    return words, supervised


def suite_sequence(rng: SampleRandom, length: int, tokenizer: Any, seed: int) -> tuple[list[int], list[int]] | None:
    """One suite row in the evaluation format (`elastic_attention.rows.encode_row`), right-padded to ``length``;
    loss on the answer and ``<eos>``.

    Returns:
        ``(input_ids, labels)``, each ``length`` long, or ``None`` when the drawn task does not fit ``length``.
    """
    task = rng.choice(tuple(TASKS))
    try:
        row = TASKS[task](length - ANSWER_RESERVE_TOKENS, seed)
    except InputError:
        return None
    encoded = encode_row(tokenizer, row)
    pad = length - len(encoded)
    input_ids = encoded.prompt_ids + encoded.answer_ids + [tokenizer.pad_token_id] * pad
    labels = [IGNORE_INDEX] * len(encoded.prompt_ids) + encoded.answer_ids + [IGNORE_INDEX] * pad
    return input_ids, labels


class StepBatches(torch.utils.data.IterableDataset):
    """Batches for steps ``start_step``, ``start_step + 1``, ...: a deterministic function of (seed, step), split
    across loader workers (worker ``w`` of ``n`` builds steps ``start_step + w``, ``+ w + n``, ...; the loader
    yields them in step order).

    Each item is ``(input_ids [B, L] int64, labels [B, L] int64, is_suite [B] bool)``, ``B * L`` about
    ``data.tokens_per_step``; ``labels`` is ``IGNORE_INDEX`` except at supervised tokens, which hold their own token
    (the target predicted from the position before).

    Args:
        data: lengths, mix and rates.
        seed: the run's seed.
        tokenizer: the suite tokenizer (`build_tokenizer`).
        start_step: the first step to build (a resumed run's step).
    """

    def __init__(self, data: PretrainData, seed: int, tokenizer: Any, start_step: int = 0) -> None:
        super().__init__()
        self.data = data
        self.seed = seed
        self.tokenizer = tokenizer
        self.ids = tokenizer.get_vocab()
        self.start_step = start_step

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch of ``step``."""
        data = self.data
        length = sequence_length(step, data, self.seed)
        count = max(1, data.tokens_per_step // length)
        rng = SampleRandom(pretrain_seed("batch", self.seed, step))
        rows, labels, is_suite = [], [], []
        for index in range(count):
            sequence = None
            suite_fraction = data.suite_fraction if step >= data.suite_start_step else 0.0
            if rng.fraction() < suite_fraction:
                sequence = suite_sequence(rng, length, self.tokenizer, pretrain_seed("row", self.seed, step, index))
            from_suite = sequence is not None
            if sequence is None:
                sequence = dense_needle_sequence(
                    rng, length, self.ids, data.needle_rate, data.query_rate, data.repeat_rate, data.echo_rate,
                    data.chain_rate, data.local_rate if step >= data.local_start_step else 0.0,
                    data.count_questions == "every",
                )
            rows.append(sequence[0])
            labels.append(sequence[1])
            is_suite.append(from_suite)
        return torch.tensor(rows), torch.tensor(labels), torch.tensor(is_suite)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        offset, stride = (0, 1) if info is None else (info.id, info.num_workers)
        step = self.start_step + offset
        while True:
            yield self.batch(step)
            step += stride

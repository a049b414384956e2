"""Pretrain a small Qwen3-architecture backbone from scratch on the synthetic long-context task suite.

Commands (one H200; the repository root as working directory):

  tiny: 4 layers, hidden 256, 4 query / 2 KV heads of head_dim 128, intermediate 768, 4.2M parameters (8.4 MB in
  bf16), lengths up to 2048, 430 s of training, about 7.5 minutes in all:

    PYTHONUNBUFFERED=1 PYTHONPATH=src python scripts/pretrain_backbone.py --preset tiny --out runs/backbone-tiny

  small: 8 layers, hidden 512, 8 query / 2 KV heads of head_dim 128, intermediate 1024, 23.6M parameters (47 MB in
  bf16), lengths up to 4096, 430 s of training, about 7.5 minutes in all:

    PYTHONUNBUFFERED=1 PYTHONPATH=src python scripts/pretrain_backbone.py --preset small --out runs/backbone-small

  The small backbone of the results is run ``small_s26`` of ``OUT=$OUT bash scripts/device_recipe.sh short``
  (2026-11-30, alone on one H200, these defaults with ``--num-workers 14 --eval-samples 24``; its 2600 steps at 256
  tokens are the small preset's default since): 5735 steps, 185M tokens in 430 s, every task 1.000 at 4096 tokens
  but local_count 0.375 (``benchmarks/results/backbones_2026-11-30.md``).

  CPU smoke test (seconds):

    PYTHONPATH=src python scripts/pretrain_backbone.py --preset tiny --max-steps 2 --max-len 256 --device cpu \
        --out /tmp/backbone-smoke

The shipped tiny backbone (``src/elastic_attention/assets/backbone_tiny``) is the run ``l3_20`` of
``OUT=$OUT bash scripts/device_recipe.sh local3`` (2026-11-30, two H200s, one run alone on each): these defaults with
``--num-workers 14 --eval-samples 24``, 14492 steps, 471M tokens in 430 s (433 s in all). Its own evaluation at 2048
tokens (24 rows per task, full attention): needle_single, needle_multikey, needle_multivalue, local_recall and
local_pattern 1.000, variable_tracking 0.958, local_count 0.542; the dense key-matching queries 0.962. Every run and
what did not work (head_dim 64, no echo, longer short phases, local blocks from step 0):
``benchmarks/results/backbones_2026-11-29.md`` and ``backbones_2026-11-30.md``. Earlier sets used other defaults,
which ``scripts/device_recipe.sh`` names for the sets that used them: before the echo recipe tiny head_dim 64, lr
2e-3, 4096 tokens, 300 s, 65536 tokens per step, a 300-step length warm-up, suite rows from step 0, no echo and no
chains; before the fifth session no local blocks.

What it does:

- Data: every step holds about ``--tokens-per-step`` tokens as ``tokens_per_step // L`` sequences of one length
  ``L``. The first ``--length-warmup-steps`` steps use ``--warmup-len``; later steps draw ``L`` uniformly from the
  multiples of 128 in ``[--min-len, --max-len]``. Each sequence is, with probability ``--suite-fraction``, one
  suite row in the evaluation format (chat template, task drawn uniformly, prompt of ``L - 16`` tokens, loss on the
  answer and ``<eos>``, right-padded with ``<pad>``) or else a dense needle sequence (filler, ``remember k v k .``
  needles with fresh keys and the echoed key supervised, ``ask k v .`` queries of earlier needles, variable
  assignments and ``hold s t .`` reverse queries, local count and pattern paragraphs with their suite questions,
  loss on every queried value), the dense supervision EVIDENCE.md recommends. Suite rows and local paragraphs start
  after the short phase (``--suite-start-step``, ``--local-start-step``). All sequences of a step have the
  same length, so there is no packing and no attention mask: right padding sits after every supervised token, which
  causal attention never lets earlier positions see. The loss is the mean of the suite-answer loss and the dense-query loss (each a per-token mean), so
  the few suite-answer tokens are not drowned by the many dense ones.
- Model: ``Qwen3Config`` with rope_theta 1e6 (written as ``rope_parameters`` where the config has it, else as
  ``rope_theta``; checked again on the reloaded ``config.json``), tied embeddings, vocabulary 1024 (the suite has
  915 tokens), SDPA attention.
- Optimization: AdamW (0.9, 0.95), weight decay 0.1 on matrices only, linear warmup over ``--warmup-steps`` then
  cosine to 10% of the peak; the cosine runs over the wall-clock budget (progress = elapsed / ``--max-seconds``, or
  step / ``--max-steps`` when that is larger), so stopping at the budget ends on a decayed learning rate. bf16
  autocast on CUDA, gradient clipping 1.0, optional ``--compile``.
- Output: ``save_pretrained`` in bf16 safetensors plus the tokenizer and a generation config, so
  ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)`` load it offline; then a
  greedy exact-match evaluation per task at ``--eval-len`` (default: ``--max-len``) under full attention, and
  ``train_summary.json`` in ``out`` (preset, config, steps, tokens, seconds, per-task accuracy).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from elastic_attention.evaluation.sampling import SampleRandom
from elastic_attention.evaluation.synthetic import (
    ROBUST_TASKS,
    SENSITIVE_TASKS,
    TASKS,
    count_question,
    generate,
    pattern_question,
    score,
)
from elastic_attention.evaluation.synthetic.filler import filler_sentence
from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer, decode_answer, render_answer, render_prompt
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
from elastic_attention.errors import InputError

ROPE_THETA = 1e6
MODEL_VOCAB_SIZE = 1024
ANSWER_RESERVE_TOKENS = 16
LENGTH_QUANTUM = 128
EVAL_SEED = 987_654_321
IGNORE = -100
FILLER_WORDS = filler_words()
CHAIN_QUERY_MARKER = "hold"  # "hold s t ." : which variable was assigned s (dense pretraining sequences only)


@dataclass(frozen=True)
class Preset:
    """Model size and training defaults of one preset.

    Attributes:
        num_layers: decoder layers.
        hidden_size: residual width.
        num_heads: query heads.
        num_kv_heads: KV heads (GQA groups).
        head_dim: per-head width; ``num_heads * head_dim`` may differ from ``hidden_size``.
        intermediate_size: MLP width.
        max_len: longest training (and default evaluation) sequence, tokens.
        lr: peak learning rate.
        max_seconds: default wall-clock training budget, seconds.
        short_phase_steps: default of ``--length-warmup-steps`` and ``--suite-start-step``: the steps of dense
            sequences at ``--warmup-len`` tokens during which key matching forms (a sharp transition, seen at
            steps 400-1150 of the shipped runs).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_len: int
    lr: float
    max_seconds: float
    short_phase_steps: int


#: The preset fields that a command-line flag of the same name (``--head-dim`` ...) overrides.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")

PRESETS: dict[str, Preset] = {
    "tiny": Preset(4, 256, 4, 2, 128, 768, max_len=2048, lr=1e-3, max_seconds=430.0, short_phase_steps=3500),
    "small": Preset(8, 512, 8, 2, 128, 1024, max_len=4096, lr=1e-3, max_seconds=430.0, short_phase_steps=2600),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse command-line arguments; device-dependent defaults are resolved in :func:`resolve_defaults`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", type=Path, required=True, help="output directory (model, tokenizer, summary)")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--max-seconds", type=float, default=None, help="training wall-clock budget, seconds")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--max-len", type=int, default=None, help="longest training sequence, tokens")
    parser.add_argument("--min-len", type=int, default=256, help="shortest sequence after the length warm-up")
    parser.add_argument("--warmup-len", type=int, default=256, help="sequence length of the length warm-up")
    parser.add_argument("--length-warmup-steps", type=int, default=None, help="default: the preset's short phase")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="default 32768 on CUDA, 2048 on CPU")
    parser.add_argument("--suite-fraction", type=float, default=0.5, help="share of sequences that are suite rows")
    parser.add_argument("--suite-start-step", type=int, default=None,
                        help="steps before the first suite row (dense only); default: the preset's short phase")
    parser.add_argument("--dense-needle-rate", type=float, default=0.2, help="needles per segment, dense sequences")
    parser.add_argument("--dense-query-rate", type=float, default=0.2, help="queries per segment, dense sequences")
    parser.add_argument("--dense-repeat-rate", type=float, default=0.0, help="rate of random copy spans in dense sequences")
    parser.add_argument("--dense-echo-rate", type=float, default=1.0, help="share of dense needles that echo their key")
    parser.add_argument("--dense-chain-rate", type=float, default=0.05, help="variable assignments and reverse queries")
    parser.add_argument("--dense-local-rate", type=float, default=0.2,
                        help="local count / pattern blocks per segment, dense sequences")
    parser.add_argument("--count-questions", choices=("one", "every"), default="one",
                        help="a dense count block asks about one of its colours or about each in turn (no better "
                        "at counting in the sixth session's runs)")
    parser.add_argument("--local-start-step", type=int, default=None,
                        help="first step whose dense sequences hold local blocks (default: the preset's short phase)")
    parser.add_argument("--dense-lm-weight", type=float, default=0.0, help="next-token loss weight, dense sequences")
    parser.add_argument("--qk-norm-init", type=float, default=1.0, help="initial query/key RMSNorm weight")
    for field in SHAPE_FIELDS:
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help=f"override the preset's {field}")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the preset's)")
    parser.add_argument("--min-lr-ratio", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--compile", action="store_true", help="torch.compile the decoder (dynamic shapes)")
    parser.add_argument("--num-workers", type=int, default=None, help="data workers (default: CPUs - 2 on CUDA)")
    parser.add_argument("--log-every", type=int, default=None, help="steps between log lines (default 50; 1 on CPU)")
    parser.add_argument("--eval-len", type=int, default=None, help="evaluation prompt length (default --max-len)")
    parser.add_argument("--eval-samples", type=int, default=None, help="rows per task (default 64 on CUDA, 2 CPU)")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="rows per generate call")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def model_shape(args: argparse.Namespace) -> Preset:
    """The preset with the shape flags given on the command line (``--num-layers`` ...) in place of its values."""
    overrides = {field: getattr(args, field) for field in SHAPE_FIELDS if getattr(args, field) is not None}
    return dataclasses.replace(PRESETS[args.preset], **overrides)


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill defaults that depend on the preset and the device; validate lengths."""
    preset = PRESETS[args.preset]
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = args.device.startswith("cuda")
    args.max_len = args.max_len or preset.max_len
    args.max_seconds = preset.max_seconds if args.max_seconds is None else args.max_seconds
    args.lr = args.lr or preset.lr
    args.tokens_per_step = args.tokens_per_step or (32768 if on_cuda else 2048)
    for name in ("length_warmup_steps", "suite_start_step", "local_start_step"):
        if getattr(args, name) is None:
            setattr(args, name, preset.short_phase_steps)
    if args.num_workers is None:
        args.num_workers = max(0, min(12, (os.cpu_count() or 1) - 2)) if on_cuda else 0
    args.log_every = args.log_every or (50 if on_cuda else 1)
    args.eval_len = args.eval_len or args.max_len
    args.eval_samples = 64 if args.eval_samples is None else args.eval_samples
    if not on_cuda and args.eval_samples == 64:
        args.eval_samples = 2
    args.eval_batch_size = args.eval_batch_size or max(1, min(64, args.tokens_per_step // args.eval_len))
    args.min_len = min(args.min_len, args.max_len)
    args.warmup_len = min(args.warmup_len, args.max_len)
    if args.max_len < 192:
        raise InputError(f"`--max-len` must be at least 192 tokens (suite rows need room), got {args.max_len}")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def _seed(*parts: Any) -> int:
    """A 64-bit seed from SHA-256 of the parts, in a namespace ("pretrain|...") apart from the suite's own seeds."""
    text = "|".join(["pretrain", *(str(part) for part in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def sequence_length(step: int, args: argparse.Namespace) -> int:
    """Length of every sequence of ``step``: the warm-up length, then uniform multiples of 128 up to the max."""
    if step < args.length_warmup_steps:
        return args.warmup_len
    choices = (args.max_len - args.min_len) // LENGTH_QUANTUM
    return args.min_len + LENGTH_QUANTUM * SampleRandom(_seed("length", args.seed, step)).integer(0, choices)


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
        ``(input_ids, labels)``, each ``length`` long; labels are ``IGNORE`` except at queried values and
        variables, repeated span tokens, echoed keys and variables, and the answers and continued items of local
        blocks.
    """
    keys = list(KEY_TOKENS)
    rng.shuffle(keys)
    stored: list[tuple[str, str]] = []
    spans: list[list[str]] = []
    words: list[str] = []
    supervised: list[int] = []
    variables = list(VARIABLE_TOKENS)
    rng.shuffle(variables)
    open_targets: list[str] = []
    assignments: list[tuple[str, str]] = []  # (source, target)
    used_values: set[str] = set()
    colors = list(COLOR_WORDS)
    if local_rate > 0:  # no draw at 0: the default stream stays as measured
        rng.shuffle(colors)
    while len(words) < length:
        draw = rng.fraction()
        if draw < needle_rate and keys:
            key, value = keys.pop(), rng.choice(VALUE_TOKENS)
            stored.append((key, value))
            echo = echo_rate > 0 and rng.fraction() < echo_rate  # no draw at 0: the default stream stays as measured
            if echo:
                supervised.append(len(words) + 3)
            words += [NEEDLE_MARKER, key, value, key, "."] if echo else [NEEDLE_MARKER, key, value, "."]
        elif draw < needle_rate + query_rate and stored:
            key, value = rng.choice(stored)
            supervised.append(len(words) + 2)
            words += [QUERY_MARKER, key, value, "."]
        elif chain_rate > 0 and draw < needle_rate + query_rate + chain_rate and variables:
            target = variables.pop()
            if open_targets and rng.fraction() < 0.5:
                source = open_targets.pop(rng.below(len(open_targets)))
            else:
                source = rng.choice([value for value in VALUE_TOKENS if value not in used_values])
                used_values.add(source)
            open_targets.append(target)
            assignments.append((source, target))
            echo = echo_rate > 0 and rng.fraction() < echo_rate
            if echo:
                supervised.append(len(words) + 4)
            words += [VARIABLE_MARKER, target, "=", source] + ([target, "."] if echo else ["."])
        elif chain_rate > 0 and draw < needle_rate + query_rate + 2 * chain_rate and assignments:
            source, target = rng.choice(assignments)
            supervised.append(len(words) + 2)
            words += [CHAIN_QUERY_MARKER, source, target, "."]
        elif local_rate > 0 and draw < needle_rate + query_rate + 2 * chain_rate + local_rate:
            block, answers = local_block(rng, colors, ask_every_color)
            supervised += [len(words) + offset for offset in answers]
            words += block
        else:
            draw = rng.fraction() if repeat_rate > 0 else 1.0  # no extra draw: the default stream stays as measured
            if draw < repeat_rate and spans:
                span = rng.choice(spans)
                supervised += range(len(words) + 1, len(words) + len(span))
                words += span
            elif draw < 2 * repeat_rate:
                span = [rng.choice(FILLER_WORDS) for _ in range(rng.integer(8, 16))] + ["."]
                spans.append(span)
                words += span
            else:
                if rng.below(8) == 0:
                    words.append(PARAGRAPH_MARKER)
                words += filler_sentence(rng, rng.integer(6, 15))
    input_ids = [ids[word] for word in words[:length]]
    labels = [IGNORE] * length
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


def suite_sequence(
    rng: SampleRandom, length: int, ids: dict[str, int], tokenizer: Any, seed: int
) -> tuple[list[int], list[int]] | None:
    """One suite row in the evaluation format, right-padded to ``length``; loss on the answer and ``<eos>``.

    Returns:
        ``(input_ids, labels)``, or ``None`` when the drawn task does not fit ``length``.
    """
    task = rng.choice(tuple(TASKS))
    try:
        row = TASKS[task](length - ANSWER_RESERVE_TOKENS, seed)
    except InputError:
        return None
    prompt = [ids[word] for word in render_prompt(tokenizer, row).split()]
    answer = [ids[word] for word in render_answer(tokenizer, row).split()]
    pad = length - len(prompt) - len(answer)
    input_ids = prompt + answer + [ids[tokenizer.pad_token]] * pad
    labels = [IGNORE] * len(prompt) + answer + [IGNORE] * pad
    return input_ids, labels


class StepBatches(torch.utils.data.IterableDataset):
    """Batches for steps 0, 1, 2, ...: a deterministic function of (seed, step), split across loader workers.

    Each item is ``(input_ids [B, L] int64, labels [B, L] int64, is_suite [B] bool)``.
    """

    def __init__(self, args: argparse.Namespace, ids: dict[str, int], tokenizer: Any) -> None:
        super().__init__()
        self.args = args
        self.ids = ids
        self.tokenizer = tokenizer

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch of ``step``."""
        length = sequence_length(step, self.args)
        count = max(1, self.args.tokens_per_step // length)
        rng = SampleRandom(_seed("batch", self.args.seed, step))
        rows, labels, is_suite = [], [], []
        for index in range(count):
            sequence = None
            suite_fraction = self.args.suite_fraction if step >= self.args.suite_start_step else 0.0
            if rng.fraction() < suite_fraction:
                sequence = suite_sequence(rng, length, self.ids, self.tokenizer, _seed("row", self.args.seed, step, index))
            from_suite = sequence is not None
            if sequence is None:
                sequence = dense_needle_sequence(
                    rng, length, self.ids, self.args.dense_needle_rate, self.args.dense_query_rate,
                    self.args.dense_repeat_rate, self.args.dense_echo_rate, self.args.dense_chain_rate,
                    self.args.dense_local_rate if step >= self.args.local_start_step else 0.0,
                    self.args.count_questions == "every",
                )
            rows.append(sequence[0])
            labels.append(sequence[1])
            is_suite.append(from_suite)
        return torch.tensor(rows), torch.tensor(labels), torch.tensor(is_suite)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        step, stride = (0, 1) if info is None else (info.id, info.num_workers)
        while True:
            yield self.batch(step)
            step += stride


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


def rope_theta_of(config: Any) -> float | None:
    """The RoPE base of a config, wherever this transformers version keeps it."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return None if theta is None else float(theta)


def build_config(preset: Preset, tokenizer: Any, max_len: int) -> Any:
    """A ``Qwen3Config`` for the preset with rope_theta 1e6, tied embeddings and the tokenizer's special ids."""
    from transformers import Qwen3Config

    common = dict(
        vocab_size=MODEL_VOCAB_SIZE,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim,
        max_position_embeddings=max(131072, max_len),
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    try:
        config = Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    except TypeError:  # transformers without rope_parameters
        config = Qwen3Config(**common, rope_theta=ROPE_THETA)
    if rope_theta_of(config) != ROPE_THETA:
        config = Qwen3Config(**common, rope_theta=ROPE_THETA)
    if rope_theta_of(config) != ROPE_THETA:
        raise RuntimeError(f"could not set rope_theta {ROPE_THETA} on Qwen3Config; got {rope_theta_of(config)}")
    return config


def build_model(config: Any, device: torch.device, qk_norm_init: float = 1.0) -> torch.nn.Module:
    """``Qwen3ForCausalLM`` from the config with SDPA attention, float32 weights on ``device``.

    ``qk_norm_init`` is the initial value of the query and key RMSNorm weights: with Qwen3's QK-norm an attention
    logit is at most ``qk_norm_init**2 * sqrt(head_dim)``, so the default of 1 caps early attention sharpness.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.fill_(qk_norm_init)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    return model.to(device=device, dtype=torch.float32)


def build_optimizer(model: torch.nn.Module, args: argparse.Namespace, on_cuda: bool) -> torch.optim.Optimizer:
    """AdamW (0.9, 0.95); weight decay on matrices only (not norms or the tied embedding)."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, parameter in model.named_parameters():
        if id(parameter) in seen or not parameter.requires_grad:
            continue
        seen.add(id(parameter))
        (decay if parameter.ndim >= 2 and "embed" not in name else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=on_cuda)


def learning_rate(step: int, elapsed: float, args: argparse.Namespace) -> float:
    """Linear warmup over steps, then cosine over the training budget (time or steps, whichever is further)."""
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    progress = elapsed / args.max_seconds if args.max_seconds > 0 else 0.0
    if args.max_steps:
        progress = max(progress, step / args.max_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * warm * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cosine)


def supervised_loss(
    model: torch.nn.Module,
    decoder: Any,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    is_suite: torch.Tensor,
    lm_weight: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Cross-entropy on supervised tokens only (logits are computed for those positions alone).

    Args:
        model: the causal LM (its ``lm_head`` is used).
        decoder: the (possibly compiled) decoder body, ``model.model``.
        input_ids: ``[B, L]`` token ids.
        labels: ``[B, L]``; ``labels[b, t]`` is the target predicted from position ``t - 1``, or ``IGNORE``.
        is_suite: ``[B]`` bool, True for suite rows.
        lm_weight: weight of an extra next-token loss on every token of the dense sequences (0 disables it).

    Returns:
        ``loss`` (mean of the suite and dense per-token means, over those present), ``suite`` and ``dense`` losses
        and ``suite_accuracy`` and ``dense_accuracy`` (argmax accuracy; NaN when a source is absent).
    """
    hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, L, hidden]
    targets = labels[:, 1:]
    mask = targets != IGNORE  # [B, L-1]
    logits = model.lm_head(hidden[:, :-1][mask]).float()  # [N, vocab]
    chosen = targets[mask]
    token_loss = F.cross_entropy(logits, chosen, reduction="none")  # [N]
    from_suite = is_suite[:, None].expand_as(mask)[mask]  # [N]
    hits = (logits.argmax(-1) == chosen).float()  # [N]
    parts = {}
    for name, selector in (("suite", from_suite), ("dense", ~from_suite)):
        present = bool(selector.any())
        nan = token_loss.new_tensor(float("nan"))
        parts[name] = token_loss[selector].mean() if present else nan
        parts[f"{name}_accuracy"] = hits[selector].mean() if present else nan
    parts["loss"] = torch.stack([parts[name] for name in ("suite", "dense") if not torch.isnan(parts[name])]).mean()
    if lm_weight > 0 and not bool(is_suite.all()):
        dense_hidden = hidden[~is_suite, :-1]  # [B_dense, L-1, hidden]
        lm_logits = model.lm_head(dense_hidden).float()
        parts["lm"] = F.cross_entropy(lm_logits.flatten(0, 1), input_ids[~is_suite, 1:].flatten())
        parts["loss"] = parts["loss"] + lm_weight * parts["lm"]
    return parts


# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


@torch.inference_mode()
def evaluate(model: torch.nn.Module, tokenizer: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Greedy exact-match accuracy per task at ``args.eval_len`` under full attention.

    Every prompt of a task has exactly ``eval_len`` tokens, so batches need no padding.

    Returns:
        ``{"length", "samples", "seconds", "accuracy": {task: float}, "sensitive_mean", "robust_mean",
        "examples": {task: [(prediction, answer), ...]}}``.
    """
    model.eval()
    start = time.perf_counter()
    accuracy: dict[str, float] = {}
    examples: dict[str, list[tuple[str, str]]] = {}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    for task in TASKS:
        rows = generate(task, args.eval_len, EVAL_SEED, args.eval_samples)
        correct = 0
        examples[task] = []
        for begin in range(0, len(rows), args.eval_batch_size):
            batch = rows[begin : begin + args.eval_batch_size]
            prompts = [tokenizer.encode(render_prompt(tokenizer, row), add_special_tokens=False) for row in batch]
            input_ids = torch.tensor(prompts, device=device)
            new_tokens = max(len(row.answer.split()) for row in batch) + 2
            with autocast:
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=new_tokens,
                    do_sample=False,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                )
            for row, generated in zip(batch, output[:, input_ids.shape[1] :].tolist(), strict=True):
                prediction = decode_answer(tokenizer, generated)
                correct += score(prediction, row)
                if len(examples[task]) < 3:
                    examples[task].append((prediction, row.answer))
        accuracy[task] = correct / max(1, len(rows))
    model.train()

    def mean(names: Sequence[str]) -> float:
        return sum(accuracy[name] for name in names) / len(names)

    return {
        "length": args.eval_len,
        "samples": args.eval_samples,
        "seconds": time.perf_counter() - start,
        "accuracy": accuracy,
        "sensitive_mean": mean(SENSITIVE_TASKS),
        "robust_mean": mean(ROBUST_TASKS),
        "examples": examples,
    }


@torch.inference_mode()
def dense_query_accuracy(
    model: torch.nn.Module, ids: dict[str, int], length: int, samples: int, device: torch.device
) -> float:
    """Teacher-forced argmax accuracy on the queried values of plain dense needle sequences (no echo, no repeats).

    This is key matching with no marker shortcut: the value after ``ask k`` is predictable only by finding the
    earlier ``remember k v``. Sequences come from ``EVAL_SEED`` and are evaluated in batches of 8.
    """
    model.eval()
    hits = total = 0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    for begin in range(0, samples, 8):
        pairs = [dense_needle_sequence(SampleRandom(_seed("dense-eval", EVAL_SEED, index)), length, ids)
                 for index in range(begin, min(samples, begin + 8))]
        input_ids = torch.tensor([pair[0] for pair in pairs], device=device)
        targets = torch.tensor([pair[1] for pair in pairs], device=device)[:, 1:]
        with autocast:
            logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1]
        mask = targets != IGNORE
        hits += int((logits.argmax(-1)[mask] == targets[mask]).sum())
        total += int(mask.sum())
    model.train()
    return hits / max(1, total)


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def train(
    model: torch.nn.Module, tokenizer: Any, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """Run the training loop until ``--max-seconds`` or ``--max-steps``; returns step, token and time counts."""
    on_cuda = device.type == "cuda"
    dataset = StepBatches(args, tokenizer.get_vocab(), tokenizer)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=args.num_workers,
        pin_memory=on_cuda,
        prefetch_factor=4 if args.num_workers else None,
        persistent_workers=False,
    )
    optimizer = build_optimizer(model, args, on_cuda)
    decoder = torch.compile(model.model, dynamic=True) if args.compile else model.model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_cuda)
    model.train()
    step = tokens = supervised = 0
    window_tokens, window_start = 0, time.perf_counter()
    start = time.perf_counter()
    last: dict[str, float] = {}
    for input_ids, labels, is_suite in loader:
        elapsed = time.perf_counter() - start
        if (args.max_steps is not None and step >= args.max_steps) or elapsed >= args.max_seconds:
            break
        supervised += int((labels != IGNORE).sum())
        input_ids = input_ids.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        is_suite = is_suite.to(device, non_blocking=True)
        lr = learning_rate(step, elapsed, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast:
            parts = supervised_loss(model, decoder, input_ids, labels, is_suite, args.dense_lm_weight)
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += input_ids.numel()
        window_tokens += input_ids.numel()
        if step % args.log_every == 0 or step == 1:
            last = {name: float(value.detach()) for name, value in parts.items()}
            now = time.perf_counter()
            print(
                f"step {step:6d}  len {input_ids.shape[1]:5d}x{input_ids.shape[0]:<3d}  loss {last['loss']:.4f}  "
                f"suite {last['suite']:.4f} ({last['suite_accuracy']:.3f})  dense {last['dense']:.4f} "
                f"({last['dense_accuracy']:.3f})  lr {lr:.2e}  "
                f"{window_tokens / (now - window_start):,.0f} tok/s  {now - start:6.1f} s",
                flush=True,
            )
            window_tokens, window_start = 0, now
    if on_cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    del loader
    return {
        "steps": step,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "seconds": seconds,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        "last_logged": last,
    }


def save(model: torch.nn.Module, tokenizer: Any, out: Path) -> dict[str, Any]:
    """Save the model in bf16 safetensors plus the tokenizer; reload the config to check rope_theta."""
    from transformers import AutoConfig

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    reloaded = AutoConfig.from_pretrained(out)
    theta = rope_theta_of(reloaded)
    if theta != ROPE_THETA:
        raise RuntimeError(f"saved config carries rope_theta {theta}, expected {ROPE_THETA}")
    weights = sum(path.stat().st_size for path in out.glob("*.safetensors"))
    return {"rope_theta_reloaded": theta, "weights_bytes": weights}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train, save, evaluate, write ``train_summary.json``; returns the summary."""
    import transformers

    total_start = time.perf_counter()
    args = resolve_defaults(parse_args(argv))
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    preset = model_shape(args)
    tokenizer = build_tokenizer()
    config = build_config(preset, tokenizer, max(args.max_len, args.eval_len))
    model = build_model(config, device, args.qk_norm_init)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"preset {args.preset}: {parameters:,} parameters, device {device}, max_len {args.max_len}, "
          f"{args.tokens_per_step} tokens/step, budget {args.max_seconds:.0f} s / {args.max_steps} steps", flush=True)

    training = train(model, tokenizer, args, device)
    print(f"trained {training['steps']} steps, {training['tokens']:,} tokens in {training['seconds']:.1f} s", flush=True)
    saved = save(model, tokenizer, args.out)  # casts to bf16: the evaluation sees the weights that were saved
    evaluation = evaluate(model, tokenizer, args, device)
    evaluation["dense_query_accuracy"] = dense_query_accuracy(
        model, tokenizer.get_vocab(), args.eval_len, max(8, args.eval_samples), device
    )
    print(f"eval dense key-matching queries len {args.eval_len}: {evaluation['dense_query_accuracy']:.3f}", flush=True)
    for task, value in evaluation["accuracy"].items():
        print(f"eval {task:18s} len {args.eval_len}: {value:.3f}", flush=True)
    print(f"eval sensitive mean {evaluation['sensitive_mean']:.3f}  robust mean {evaluation['robust_mean']:.3f}  "
          f"({evaluation['seconds']:.1f} s)", flush=True)

    summary = {
        "preset": args.preset,
        "model_shape": dataclasses.asdict(preset),  # the preset with the shape flags applied
        "parameters": parameters,
        "config": config.to_dict(),
        "args": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()},
        "steps": training["steps"],
        "tokens": training["tokens"],
        "supervised_tokens": training["supervised_tokens"],
        "train_seconds": training["seconds"],
        "tokens_per_second": training["tokens_per_second"],
        "last_logged": training["last_logged"],
        "eval": evaluation,
        **saved,
        "total_seconds": time.perf_counter() - total_start,
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    (args.out / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"saved to {args.out} ({saved['weights_bytes'] / 1e6:.1f} MB weights) in "
          f"{summary['total_seconds']:.1f} s total", flush=True)
    return summary


if __name__ == "__main__":
    main()

"""The pretraining recipe's own evaluation of a fresh backbone, under full attention (no routers attached).

Greedy exact match per task of the synthetic suite at one prompt length, and the teacher-forced accuracy of dense
key-matching queries. Rows come from :data:`EVAL_SEED`, apart from the suite's evaluation seeds, so the numbers of
every pretraining run since the first are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from elastic_attention.chat import encode_prompt
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.evaluation.synthetic import ROBUST_TASKS, SENSITIVE_TASKS, TASKS, generate, score
from elastic_attention.evaluation.synthetic.tokenizer import decode_answer
from elastic_attention.training.data import IGNORE_INDEX
from elastic_attention.training.pretrain_config import PretrainEval
from elastic_attention.training.pretrain_data import dense_needle_sequence, pretrain_seed

EVAL_SEED = 987_654_321

#: Dense sequences per forward of :func:`dense_query_accuracy`.
DENSE_EVAL_BATCH = 8


@torch.inference_mode()
def evaluate_tasks(model: torch.nn.Module, tokenizer: Any, settings: PretrainEval, device: torch.device) -> dict:
    """Greedy exact-match accuracy per task at ``settings.length`` tokens under full attention.

    Every prompt of a task has exactly ``settings.length`` tokens, so batches need no padding.

    Returns:
        ``{"length", "samples", "seconds", "accuracy": {task: float}, "sensitive_mean", "robust_mean",
        "examples": {task: [(prediction, answer), ...]}}`` (three examples per task).
    """
    model.eval()
    start = time.perf_counter()
    accuracy: dict[str, float] = {}
    examples: dict[str, list[tuple[str, str]]] = {}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    for task in TASKS:
        rows = generate(task, settings.length, EVAL_SEED, settings.samples)
        correct = 0
        examples[task] = []
        for begin in range(0, len(rows), settings.batch_size):
            batch = rows[begin : begin + settings.batch_size]
            input_ids = torch.tensor([encode_prompt(tokenizer, row.prompt) for row in batch], device=device)
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
        "length": settings.length,
        "samples": settings.samples,
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
    earlier ``remember k v``. ``samples`` sequences of ``length`` tokens come from ``EVAL_SEED``.

    Returns:
        The share of queried values predicted right, in [0, 1].
    """
    model.eval()
    hits = total = 0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    for begin in range(0, samples, DENSE_EVAL_BATCH):
        pairs = [dense_needle_sequence(SampleRandom(pretrain_seed("dense-eval", EVAL_SEED, index)), length, ids)
                 for index in range(begin, min(samples, begin + DENSE_EVAL_BATCH))]
        input_ids = torch.tensor([pair[0] for pair in pairs], device=device)
        targets = torch.tensor([pair[1] for pair in pairs], device=device)[:, 1:]
        with autocast:
            logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1]
        mask = targets != IGNORE_INDEX
        hits += int((logits.argmax(-1)[mask] == targets[mask]).sum())
        total += int(mask.sum())
    model.train()
    return hits / max(1, total)

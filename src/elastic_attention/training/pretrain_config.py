"""`PretrainConfig`: everything a backbone-pretraining run needs, read from YAML with `key=value` overrides.

The defaults are the recipe of the shipped tiny backbone (``configs/backbone_tiny.yaml`` lists them all).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_attention.errors import ConfigError
from elastic_attention.training.config_io import build_section, check_types, read_yaml, unknown_keys

#: The shortest ``data.max_len`` and ``eval.length``: suite rows of every task need this many tokens.
MIN_SEQUENCE_TOKENS = 192

#: Settings that may change when a pretraining run is resumed (where and how it runs, and the final evaluation).
PRETRAIN_RESUMABLE = frozenset({"output_dir", "checkpoint_every", "device", "num_workers", "log_every", "compile",
                                "eval"})


@dataclass(frozen=True)
class BackboneShape:
    """The Qwen3 decoder to train (vocabulary 1024, rope_theta 1e6, tied embeddings: see `training.backbone`).

    Attributes:
        num_layers: decoder layers.
        hidden_size: residual width.
        num_heads: query heads.
        num_kv_heads: KV heads (GQA groups); divides ``num_heads``.
        head_dim: per-head width; ``num_heads * head_dim`` may differ from ``hidden_size``.
        intermediate_size: MLP width.
        qk_norm_init: initial query and key RMSNorm weight: with Qwen3's QK-norm an attention logit is at most
            ``qk_norm_init**2 * sqrt(head_dim)``, so 1 caps early attention sharpness.
    """

    num_layers: int = 4
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 128
    intermediate_size: int = 768
    qk_norm_init: float = 1.0


@dataclass(frozen=True)
class PretrainData:
    """The step batches (`training.pretrain_data`): lengths, the mix of suite rows and dense sequences, the rates.

    Every step holds about ``tokens_per_step`` tokens as ``tokens_per_step // L`` sequences of one length ``L``: the
    first ``length_warmup_steps`` steps use ``warmup_len``; later steps draw ``L`` uniformly from
    ``min_len + 128 k`` up to ``max_len``. Lengths are tokens.

    Attributes:
        max_len: longest sequence.
        min_len: shortest sequence after the length warm-up.
        warmup_len: sequence length of the length warm-up (the short phase where key matching forms).
        length_warmup_steps: steps at ``warmup_len``.
        tokens_per_step: tokens per optimizer step (sequences per step = this // length, at least 1).
        suite_fraction: share of a step's sequences that are suite rows (from ``suite_start_step`` on).
        suite_start_step: steps of dense sequences only before the first suite row.
        needle_rate, query_rate: needles ``remember k v .`` and inline queries ``ask k v .`` per segment of a
            dense sequence.
        repeat_rate: rate of random spans and their verbatim copies in dense sequences.
        echo_rate: share of needles (and variable assignments) that repeat their key (target) after the value.
        chain_rate: variable assignments, and again reverse queries ``hold s t .``, per segment.
        local_rate: local count / pattern blocks per segment, from ``local_start_step`` on.
        local_start_step: first step whose dense sequences hold local blocks.
        count_questions: ``"one"`` (a count block asks about one of its colours) or ``"every"`` (each in turn).
    """

    max_len: int = 2048
    min_len: int = 256
    warmup_len: int = 256
    length_warmup_steps: int = 3500
    tokens_per_step: int = 32768
    suite_fraction: float = 0.5
    suite_start_step: int = 3500
    needle_rate: float = 0.2
    query_rate: float = 0.2
    repeat_rate: float = 0.0
    echo_rate: float = 1.0
    chain_rate: float = 0.05
    local_rate: float = 0.2
    local_start_step: int = 3500
    count_questions: str = "one"


@dataclass(frozen=True)
class PretrainEval:
    """The evaluation after training, on the saved (bf16) weights under full attention.

    Attributes:
        length: prompt length of the suite rows, tokens.
        samples: rows per task (greedy exact match); the dense key-matching accuracy uses ``max(8, samples)``
            sequences of the same length.
        batch_size: rows per ``generate`` call.
    """

    length: int = 2048
    samples: int = 24
    batch_size: int = 16


@dataclass(frozen=True)
class PretrainConfig:
    """A pretraining run of a small Qwen3 backbone on the synthetic suite.

    Attributes:
        output_dir: run folder: ``model/`` (the backbone and its tokenizer, bf16 safetensors, ``train_summary.json``),
            ``checkpoints/``, ``metrics.csv``, ``training.png``, ``summary.json``.
        model: see `BackboneShape`.
        data: see `PretrainData`.
        eval: see `PretrainEval`.
        lr: peak learning rate of AdamW (0.9, 0.95).
        min_lr_ratio: the cosine ends at ``lr * min_lr_ratio``.
        warmup_steps: steps of linear warm-up (the cosine runs from step 0; the warm-up scales it).
        weight_decay: on matrices only (not norms or the tied embedding).
        grad_clip: gradient norm clip.
        dense_lm_weight: weight of an extra next-token loss on every token of the dense sequences (0: none).
        max_steps: stop after this many steps (null: no step limit).
        max_seconds: training wall-clock budget, seconds (null: none). The cosine's progress is the larger of
            ``elapsed / max_seconds`` and ``step / max_steps``, so a run stopped by its budget ends decayed.
        checkpoint_every: steps between checkpoints, plus one at the end (0: no checkpoints).
        log_every: steps between logged metrics (metrics.csv, the log line); step 1 is always logged.
        num_workers: data-loader processes (0: batches are built in the training process).
        compile: ``torch.compile`` the decoder (dynamic shapes).
        seed: model initialisation and data seed.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``; bf16 autocast on CUDA.
    """

    output_dir: str = "runs/backbone"
    model: BackboneShape = field(default_factory=BackboneShape)
    data: PretrainData = field(default_factory=PretrainData)
    eval: PretrainEval = field(default_factory=PretrainEval)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dense_lm_weight: float = 0.0
    max_steps: int | None = 14492
    max_seconds: float | None = None
    checkpoint_every: int = 0
    log_every: int = 50
    num_workers: int = 0
    compile: bool = False
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        for section, prefix in ((self, ""), (self.model, "model."), (self.data, "data."), (self.eval, "eval.")):
            check_types(section, prefix)
        _check_shape(self.model)
        _check_data(self.data)
        _check_eval(self.eval)
        if not self.lr > 0:
            raise ConfigError(f"`lr` must be positive, got {self.lr}")
        for name in ("weight_decay", "grad_clip", "dense_lm_weight", "warmup_steps", "checkpoint_every",
                     "num_workers", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"`{name}` must be at least 0, got {getattr(self, name)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"`min_lr_ratio` must be in [0, 1], got {self.min_lr_ratio}")
        if self.max_steps is None and self.max_seconds is None:
            raise ConfigError("set `max_steps` or `max_seconds` (or both): without either the run never ends")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"`max_steps` must be at least 1 or null, got {self.max_steps}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(f"`max_seconds` must be a positive number of seconds or null, got {self.max_seconds}")
        if self.log_every < 1:
            raise ConfigError(f"`log_every` must be at least 1, got {self.log_every}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"`device` must be auto, cpu or cuda, got {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PretrainConfig:
        data = dict(data)
        unknown_keys(cls, data, "pretraining config", ("targets", "router-training", "train"))
        for name, kind in (("model", BackboneShape), ("data", PretrainData), ("eval", PretrainEval)):
            if name in data:
                data[name] = build_section(kind, data[name], name)
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> PretrainConfig:
        """Read a YAML file and apply ``key=value`` / ``section.key=value`` overrides (values parsed as YAML)."""
        return cls.from_dict(read_yaml(path, overrides))


def _check_shape(shape: BackboneShape) -> None:
    for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
        if getattr(shape, name) < 1:
            raise ConfigError(f"`model.{name}` must be at least 1, got {getattr(shape, name)}")
    if shape.num_heads % shape.num_kv_heads:
        raise ConfigError(f"`model.num_heads` ({shape.num_heads}) must be a multiple of `model.num_kv_heads` "
                          f"({shape.num_kv_heads})")
    if not shape.qk_norm_init > 0:
        raise ConfigError(f"`model.qk_norm_init` must be positive, got {shape.qk_norm_init}")


def _check_data(data: PretrainData) -> None:
    if data.max_len < MIN_SEQUENCE_TOKENS:
        raise ConfigError(f"`data.max_len` must be at least {MIN_SEQUENCE_TOKENS} tokens (suite rows need room), got "
                          f"{data.max_len}")
    for name in ("min_len", "warmup_len"):
        if not 1 <= getattr(data, name) <= data.max_len:
            raise ConfigError(f"`data.{name}` must be in [1, data.max_len = {data.max_len}], got "
                              f"{getattr(data, name)}; lower it or raise `data.max_len`")
    if data.tokens_per_step < 1:
        raise ConfigError(f"`data.tokens_per_step` must be at least 1, got {data.tokens_per_step}")
    for name in ("length_warmup_steps", "suite_start_step", "local_start_step"):
        if getattr(data, name) < 0:
            raise ConfigError(f"`data.{name}` must be at least 0, got {getattr(data, name)}")
    for name in ("suite_fraction", "needle_rate", "query_rate", "repeat_rate", "echo_rate", "chain_rate",
                 "local_rate"):
        if not 0 <= getattr(data, name) <= 1:
            raise ConfigError(f"`data.{name}` must be in [0, 1], got {getattr(data, name)}")
    if data.count_questions not in ("one", "every"):
        raise ConfigError(f"`data.count_questions` must be 'one' or 'every', got {data.count_questions!r}")


def _check_eval(settings: PretrainEval) -> None:
    if settings.length < MIN_SEQUENCE_TOKENS:
        raise ConfigError(f"`eval.length` must be at least {MIN_SEQUENCE_TOKENS} tokens (suite rows need room), got "
                          f"{settings.length}")
    for name in ("samples", "batch_size"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"`eval.{name}` must be at least 1, got {getattr(settings, name)}")

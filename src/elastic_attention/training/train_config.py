"""`TrainConfig`: everything a router-training run needs, read from YAML with `key=value` overrides."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from elastic_attention.adapters import CONFIG_FILE as ADAPTER_CONFIG
from elastic_attention.adapters import WEIGHTS_FILE as ADAPTER_WEIGHTS
from elastic_attention.adapters import read_adapter_config
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import AdapterMismatchError, ConfigError
from elastic_attention.head_sets import load_head_set, read_head_sets, split_set_reference
from elastic_attention.router.temperature import TemperatureSchedule
from elastic_attention.training.config_io import (
    build_section,
    check_number,
    check_types,
    read_yaml,
    unknown_keys,
)

#: Paper targets: sparsity-robust tasks 1.0, sparsity-sensitive tasks 0.7.
SUITE_TARGETS = {
    "needle_single": 0.7, "needle_multikey": 0.7, "needle_multivalue": 0.7, "variable_tracking": 0.7,
    "local_recall": 1.0, "local_pattern": 1.0, "local_count": 1.0,
}

#: What the LM term of the objective measures on the supervised tokens (see `TrainConfig.lm_loss`).
LM_LOSS_KINDS = ("cross_entropy", "distillation")
#: How a step scores a head-set router's choice (`TrainConfig.head_set_objective`).
HEAD_SET_OBJECTIVES = ("sampled", "expected")
ROUTER_OBJECTIVES = ("paper", "signal_teacher", "both")

#: Router learning-rate schedules after the warm-up.
LR_SCHEDULES = ("cosine", "constant")

#: ``data.source`` values that generate rows from a task suite: source -> suite name
#: (see `elastic_attention.evaluation.suites`); any other source is a local row file.
SUITE_SOURCES = {"suite": "synthetic", "synthetic": "synthetic", "code": "code", "broad": "broad"}


def check_task_names(sections: dict[str, dict], known, where: str) -> None:
    """ConfigError naming every task of a per-task section (``targets``, ``bounds``: section name -> its mapping)
    that is not among ``known`` (the tasks the data holds), with the known names: a misspelt task would otherwise
    keep its default and train to the end."""
    known = sorted(set(known))
    for section, values in sections.items():
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"`{section}` names tasks {unknown} that are not {where}; known: {known}")


@dataclass(frozen=True)
class DataConfig:
    """Where rows come from and how they are packed.

    Attributes:
        source: ``"suite"`` or ``"synthetic"`` (the synthetic task suite), ``"code"`` (the real-text code suite,
            lengths in the model's tokens), or a local .jsonl / .parquet file.
        tasks: suite tasks to draw (suites only).
        lengths: suite prompt lengths in tokens, cycled over the rows (suites only).
        rows: number of suite rows (suites only).
        seed: suite seed and data-order seed (the evaluation uses seed 0: keep them apart).
        budget: tokens per pack.
        answer_only: labels on answer tokens only; else on the whole sample.
        on_overlong: ``"error"`` or ``"skip"`` for rows longer than the budget.
        fresh_rows: suites only: every epoch draws rows no epoch saw (epoch e: the suite at ``seed + e * 1000003``;
            epoch 0: at ``seed``), packed alike (each epoch must give as many packs as the first). Off: every epoch
            repeats the first epoch's rows, reshuffled.
    """

    source: str = "suite"
    tasks: tuple[str, ...] = tuple(SUITE_TARGETS)
    lengths: tuple[int, ...] = (1024,)
    rows: int = 256
    seed: int = 1000
    budget: int = 4096
    answer_only: bool = True
    on_overlong: str = "error"
    fresh_rows: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """A router-training run (defaults follow the paper's objective, `docs/method.md`).

    Attributes:
        model: folder of the backbone and its tokenizer.
        output_dir: run folder: checkpoints, logs, plots, the router adapter and the summary.
        elastic: the ElasticConfig fields for attach.
        data: see `DataConfig`.
        targets: task -> target MSR; ``None``: the paper's (`SUITE_TARGETS`) for the data's suite tasks, or all of
            them for a row file.
        bounds: task -> [lower, upper] MSR band (optional).
        linear_term: ``"signed"`` or ``"absolute"``.
        lm_loss: the LM term on the supervised (answer) tokens: ``"cross_entropy"`` against the row's answer (the
            paper's CE(Y | X)), or ``"distillation"``, the KL divergence from the same model's full-attention
            distribution (a no-grad teacher forward with every head full, about one more forward per pack).
        teacher_cache: with ``lm_loss: distillation``, keep each pack's teacher log-probabilities in host memory after
            its first visit, so a pack seen again costs no teacher forward (supervised tokens x vocabulary x 4 bytes a
            pack; ``summary.json``'s ``teacher_cache_bytes`` says how much a run held).
        steps: optimizer steps.
        max_seconds: training wall-clock budget, seconds (null: none; setup and calibration not counted): the run
            stops at ``steps`` or when the budget is spent, whichever comes first. The schedules (warm-up, learning
            rate, temperature) follow the larger of ``step / steps`` and the share of the budget spent, so a run
            stopped by its budget ends annealed, as a run of fewer steps would; the first-visit forwards of
            ``head_set_objective: expected`` count against the budget but not toward that share
            (`trainer.schedule_position`), so a slow first epoch does not run the schedules ahead of the steps.
        packs_per_step: global batch, in packs.
        router_lr, multiplier_lr, weight_decay, warmup_fraction, grad_clip: optimisation.
        lr_schedule: the router learning rate after its linear warm-up: ``"cosine"`` (decays to 0 at the last step)
            or ``"constant"``. The multipliers' learning rate is always constant.
        temperature: see `TemperatureSchedule`.
        margin_limit: clamp of the router's logit margin while sampling (forward only, see
            `straight_through_decision`); ``None`` (the paper) leaves it free.
        initial_full_probability: probability that a router's first decisions choose full attention, set through
            the bias of its output layer before step 0 (routing starts near the dense model and the objective
            prunes heads from there); ``None`` (the paper) keeps the zero bias, a coin flip.
        initial_full_heads: a head set to start from, the ``--out`` file of ``elastic-attention search-heads``: its
            full-attention KV heads start at P(full) = ``initial_full_probability`` and the others at 1 minus that
            (through each standardizing router's ``head_bias``). ``None``: every head starts alike.
        initial_full_heads_msr: which of that file's sets (its ``msr_asked``); needed when it holds several.
        sparse_outside_initial_heads: pin every KV head outside ``initial_full_heads`` to sparse attention for
            every input (`AttentionRouter.pin_sparse`; the adapter keeps the pins): the routers choose per input
            only among the set's heads, so an input that needs them keeps at most the searched set and one that
            does not can drop all of it.
        head_set_choices_msrs: with ``elastic.head_set_choices`` C, the C head sets the `HeadSetRouter` chooses
            among, as MSRs of ``initial_full_heads`` (sets it kept, or points of its greedy path; 1.0 is every head
            sparse): e.g. ``[0.5, 0.6, 0.7, 0.8, 1.0]``. With ``initial_full_probability`` the set with the most
            full heads starts at that probability. Not with ``initial_full_heads_msr``, ``sparse_outside_initial_heads``
            or ``margin_limit`` (which act on per-head routers).
        head_set_choices_extra: more sets to choose among, after those of ``head_set_choices_msrs``, each
            ``"FILE@MSR"``: the set at that MSR of another head-set file of the same model (e.g. a search on one
            task, whose set keeps that task where the joint search's set of the same MSR does not); counted in
            ``elastic.head_set_choices``.
        head_set_objective: how a step scores a head-set router's choice: ``"sampled"`` (the paper's estimator:
            one Gumbel-softmax choice per prompt, its gradient straight through the chosen set's heads) or
            ``"expected"`` (each pack runs once under each of the C sets, without gradients; the LM term and each
            prompt's MSR in the sparsity term are their expectations under the router's softmax at the temperature,
            so a prompt on a set that fails it learns from the loss it has on every other set, however sure the
            router was; C no-grad forwards at a pack's first visit, whose results its later visits reuse, and no
            backward through the backbone). Not with ``distributed: fsdp``. The run writes these losses to
            ``set_losses.safetensors`` in its folder (`training.set_losses`).
        set_losses_file: with ``head_set_objective: expected``, an earlier run's ``set_losses.safetensors`` (the same
            model, data settings and sets): its packs' losses replace their forwards, and their router inputs the
            routers' calibration, so that a run with other targets, temperatures or rates trains only the router
            (on a CPU too) when the file holds every pack. A run pooling other spans than the file's reads its
            router inputs again (each pack's forward stops at the router).
        router_objective: ``"paper"`` (the LM term and the MSR targets), ``"signal_teacher"`` (only the label-free
            retrieval-signal teacher, `training.signal_teacher`: no task targets are used, any long text teaches; a
            suite's tasks need no `targets` entry then) or ``"both"`` (their sum, the teacher weighted by
            ``signal_teacher_weight``).
        signal_teacher_threshold: the teacher's tau, in (0, 1]: a KV head whose prompt's last queries put at least
            this share of their attention where SSA cannot see (measured under full attention with
            ``elastic.signal_queries`` and ``elastic.signal_statistic``) should run full attention.
        signal_teacher_layer: None: the per-head teacher above; a routed layer's index: the per-prompt teacher, a
            prompt whose signal at that layer (the largest over its KV heads) reaches the threshold needs every head
            full, another none (a head-set router learns its densest set or its sparsest).
        signal_teacher_weight: the teacher's weight in ``"both"``.
        initial_router: a router adapter folder (`save_router`'s, e.g. a finished run's ``router/``) to start from:
            its weights, input statistics and pins replace the routers' initialization (no calibration), so a run
            can continue where an earlier one's adapter left off. The optimizer's state and the objective's
            multipliers start afresh (a checkpoint keeps them: ``--resume``). The adapter must have been trained
            with this run's ``elastic`` settings. Not with ``initial_full_probability`` or ``initial_full_heads``.
        checkpoint_every: steps between checkpoints (0: only at the end).
        seed: initialisation and Gumbel-noise seed.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        distributed: ``"none"``, ``"ddp"`` (replicated backbone) or ``"fsdp"`` (FSDP2-sharded backbone).
        gradient_checkpointing: recompute each decoder layer in the backward pass (less memory, about one more
            forward of time); for long packs.
        fsdp_reshard_after_forward: with ``distributed: fsdp``, free each layer's gathered weights after its
            forward (least memory) or keep them for the backward (one all-gather per layer and step fewer).
    """

    model: str = ""
    output_dir: str = "runs/router"
    elastic: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    targets: dict[str, float] | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    linear_term: str = "signed"
    lm_loss: str = "cross_entropy"
    teacher_cache: bool = True
    steps: int = 100
    max_seconds: float | None = None
    packs_per_step: int = 4
    router_lr: float = 5e-4
    multiplier_lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.2
    lr_schedule: str = "cosine"
    grad_clip: float = 5.0
    temperature: TemperatureSchedule = field(default_factory=TemperatureSchedule)
    margin_limit: float | None = None
    initial_full_probability: float | None = None
    initial_full_heads: str | None = None
    initial_full_heads_msr: float | None = None
    sparse_outside_initial_heads: bool = False
    head_set_choices_msrs: list[float] | None = None
    head_set_choices_extra: list[str] | None = None
    head_set_objective: str = "sampled"
    set_losses_file: str | None = None
    router_objective: str = "paper"
    signal_teacher_threshold: float = 0.2
    signal_teacher_layer: int | None = None
    signal_teacher_weight: float = 1.0
    initial_router: str | None = None
    checkpoint_every: int = 0
    seed: int = 0
    device: str = "auto"
    distributed: str = "none"
    gradient_checkpointing: bool = False
    fsdp_reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        check_types(self, "")
        check_types(self.data, "data.")
        if not self.model:
            raise ConfigError("`model` must name the backbone folder")
        for name in ("router_lr", "multiplier_lr", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0 or (name.endswith("_lr") and getattr(self, name) == 0):
                bound = "positive" if name.endswith("_lr") else "at least 0"
                raise ConfigError(f"`{name}` must be {bound}, got {getattr(self, name)}")
        for name in ("rows", "budget"):
            if getattr(self.data, name) < 1:
                raise ConfigError(f"`data.{name}` must be at least 1, got {getattr(self.data, name)}")
        if not self.data.tasks or not self.data.lengths or any(length < 1 for length in self.data.lengths):
            raise ConfigError(f"`data.tasks` and `data.lengths` must be non-empty lists of names and positive "
                              f"token counts, got {list(self.data.tasks)} and {list(self.data.lengths)}")
        for name in ("steps", "packs_per_step"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`{name}` must be at least 1, got {getattr(self, name)}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(f"`max_seconds` must be a positive number of seconds or null, got {self.max_seconds}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"`checkpoint_every` must be >= 0, got {self.checkpoint_every}")
        if self.distributed not in ("none", "ddp", "fsdp"):
            raise ConfigError(f"`distributed` must be none, ddp or fsdp, got {self.distributed!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"`device` must be auto, cpu or cuda, got {self.device!r}")
        if self.margin_limit is not None and not self.margin_limit > 0:
            raise ConfigError(f"`margin_limit` must be a positive number of logits or null, got {self.margin_limit}")
        if self.initial_full_probability is not None and not 0 < self.initial_full_probability < 1:
            raise ConfigError(
                f"`initial_full_probability` must be in (0, 1) or null, got {self.initial_full_probability}"
            )
        if self.elastic.get("signal_layer") is not None:
            raise ConfigError("`elastic.signal_layer` makes a SignalSetRouter, which has no weights to train: "
                              "calibrate its thresholds on validation rows (docs/guide-evaluate.md)")
        if self.data.fresh_rows:
            self._check_fresh_rows()
        if (self.elastic.get("head_set_choices") or self.head_set_choices_msrs is not None
                or self.head_set_choices_extra):
            self._check_head_set_choices()
        elif self.initial_full_heads is not None:
            if self.initial_full_probability is None:
                raise ConfigError("`initial_full_heads` needs `initial_full_probability`: the P(full) its heads start "
                                  "at (the others start at 1 minus it), e.g. 0.9")
            if not self.elastic.get("router_standardize", False):
                raise ConfigError("`initial_full_heads` sets a bias per KV head, which only standardizing routers have:"
                                  " set `elastic.router_standardize: true`")
            self.initial_head_set()
        elif self.initial_full_heads_msr is not None:
            raise ConfigError("`initial_full_heads_msr` picks a set of `initial_full_heads`, which is not set")
        elif self.sparse_outside_initial_heads:
            raise ConfigError("`sparse_outside_initial_heads` pins the heads outside `initial_full_heads`, which is "
                              "not set: give the head set (the --out file of `elastic-attention search-heads`)")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"`warmup_fraction` must be in [0, 1), got {self.warmup_fraction}")
        self._check_router_objective()
        if self.head_set_objective not in HEAD_SET_OBJECTIVES:
            raise ConfigError(f"`head_set_objective` must be one of {HEAD_SET_OBJECTIVES}, got "
                              f"{self.head_set_objective!r}")
        if self.head_set_objective == "expected":
            if not self.elastic.get("head_set_choices"):
                raise ConfigError("`head_set_objective: expected` scores the sets of a head-set router: set "
                                  "`elastic.head_set_choices` (or use the default, sampled)")
            if self.distributed == "fsdp":
                raise ConfigError("`head_set_objective: expected` runs its forwards without gradients, which FSDP's "
                                  "sharded router does not support: use `distributed: ddp` or one GPU")
        elif self.set_losses_file is not None:
            raise ConfigError("`set_losses_file` holds the losses of `head_set_objective: expected`: set it, or null "
                              "the file")
        if self.set_losses_file is not None and not Path(self.set_losses_file).is_file():
            raise ConfigError(f"`set_losses_file` {self.set_losses_file} is not a file (a head-set run writes "
                              "set_losses.safetensors in its folder)")
        if self.lm_loss not in LM_LOSS_KINDS:
            raise ConfigError(f"`lm_loss` must be one of {LM_LOSS_KINDS}, got {self.lm_loss!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"`lr_schedule` must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.targets is None and self.router_objective == "signal_teacher" and self.data.source in SUITE_SOURCES:
            # the teacher alone uses no target: these only name the tasks the logs group MSR by
            object.__setattr__(self, "targets", {task: 1.0 for task in self.data.tasks})
        if self.targets is None:
            paper = {task: SUITE_TARGETS[task] for task in self.data.tasks if task in SUITE_TARGETS}
            object.__setattr__(self, "targets", paper if self.data.source in SUITE_SOURCES else dict(SUITE_TARGETS))
        self._check_per_task_settings()
        if self.data.source in SUITE_SOURCES:
            missing = sorted(set(self.data.tasks) - set(self.targets))
            if missing:
                raise ConfigError(f"suite tasks {missing} have no entry in `targets`")
            check_task_names({"targets": self.targets, "bounds": self.bounds}, self.data.tasks, "in `data.tasks`")
        if not isinstance(self.elastic, dict):
            raise ConfigError(f"`elastic` must be a mapping of ElasticConfig fields, got {self.elastic!r}")
        known = {f.name for f in dataclasses.fields(ElasticConfig)}
        unknown = sorted(set(self.elastic) - known)
        if unknown:
            raise ConfigError(f"unknown `elastic` keys {unknown}; known: {sorted(known)}")
        ElasticConfig(**self.elastic)
        if self.initial_router is not None:
            if self.initial_full_probability is not None or self.initial_full_heads is not None:
                raise ConfigError("`initial_router` starts the routers from an adapter, `initial_full_probability` and "
                                  "`initial_full_heads` from a bias: set one of them (null the others)")
            self._check_initial_router()

    def _check_router_objective(self) -> None:
        """``router_objective`` and the signal teacher's settings."""
        if self.router_objective not in ROUTER_OBJECTIVES:
            raise ConfigError(f"`router_objective` must be one of {ROUTER_OBJECTIVES}, got {self.router_objective!r}")
        if not 0 < self.signal_teacher_threshold <= 1 or not self.signal_teacher_weight > 0:
            raise ConfigError(f"`signal_teacher_threshold` must be in (0, 1] and `signal_teacher_weight` positive, got "
                              f"{self.signal_teacher_threshold} and {self.signal_teacher_weight}")
        if self.signal_teacher_layer is not None and self.signal_teacher_layer < 0:  # its type is checked above
            raise ConfigError(f"`signal_teacher_layer` must be a layer index (>= 0) or null, got "
                              f"{self.signal_teacher_layer!r}")
        if self.signal_teacher_layer is not None and self.router_objective == "paper":
            raise ConfigError("`signal_teacher_layer` sets the signal teacher, which `router_objective: paper` does "
                              "not use: choose `signal_teacher` or `both`, or drop it")
        if self.router_objective != "paper" and self.head_set_objective == "expected":
            raise ConfigError("the signal teacher trains on sampled routing: use `head_set_objective: sampled`")

    def _check_fresh_rows(self) -> None:
        """``data.fresh_rows`` draws from a suite, and no per-pack cache is asked for (no pack is seen twice)."""
        if self.data.source not in SUITE_SOURCES:
            raise ConfigError(f"`data.fresh_rows` draws new rows from a suite each epoch; `data.source` "
                              f"{self.data.source!r} is a row file: set it to one of {sorted(SUITE_SOURCES)}")
        if self.head_set_objective == "expected" or self.set_losses_file is not None:
            raise ConfigError("`head_set_objective: expected` keeps each pack's losses under every set for its later "
                              "visits, and with `data.fresh_rows` no pack is visited twice: use the sampled objective "
                              "or turn fresh_rows off")
        if self.lm_loss == "distillation" and self.teacher_cache:
            raise ConfigError("`teacher_cache` keeps each pack's teacher for its later visits, and with "
                              "`data.fresh_rows` no pack is visited twice: set `teacher_cache: false`")

    def _check_head_set_choices(self) -> None:
        """``elastic.head_set_choices`` and ``head_set_choices_msrs`` (with ``head_set_choices_extra``) agree, and
        the sets load."""
        choices = self.elastic.get("head_set_choices")
        if self.head_set_choices_extra and self.head_set_choices_msrs is None:
            raise ConfigError("`head_set_choices_extra` adds sets after those of `head_set_choices_msrs`: give that "
                              "too (e.g. [1.0] for all-SSA beside the extra sets)")
        if self.head_set_choices_msrs is None:
            if self.initial_router is None:
                raise ConfigError(f"`elastic.head_set_choices: {choices}` needs the sets to choose among: "
                                  "`head_set_choices_msrs` (MSRs of the `initial_full_heads` file) or an "
                                  "`initial_router` that carries them")
            return
        count = len(self.head_set_choices_msrs) + len(self.head_set_choices_extra or [])
        if choices != count:
            listed = ("`head_set_choices_msrs` and `head_set_choices_extra` list" if self.head_set_choices_extra
                      else "`head_set_choices_msrs` lists")
            raise ConfigError(f"{listed} {count} sets but `elastic.head_set_choices` is {choices!r}: set it to {count}")
        clashing = [name for name, value in (("initial_full_heads_msr", self.initial_full_heads_msr),
                                             ("sparse_outside_initial_heads", self.sparse_outside_initial_heads),
                                             ("margin_limit", self.margin_limit),
                                             ("initial_router", self.initial_router)) if value]
        if clashing:
            raise ConfigError(f"`head_set_choices_msrs` builds the sets of a head-set router; {', '.join(clashing)} "
                              "acts on per-head routers or another start: null it")
        if self.initial_full_heads is None:
            raise ConfigError("`head_set_choices_msrs` takes its sets from `initial_full_heads`: give the head-set "
                              "file (the --out file of `elastic-attention search-heads`)")
        self.head_set_choices()

    def head_set_choices(self, model_shape: tuple[int, int] | None = None) -> torch.Tensor | None:
        """[C, routed layers, Hkv] bool, the sets of ``head_set_choices_msrs`` then ``head_set_choices_extra`` (True =
        full attention), or ``None``. ``model_shape``: the model's (routed layers, Hkv), checked when given.

        Raises:
            ConfigError: an MSR outside [0, 1] or not reached by its file, an extra entry not of the form
                ``FILE@MSR``, a file whose sets have another shape than ``initial_full_heads``', or sets of another
                shape than ``model_shape``.
        """
        if self.head_set_choices_msrs is None:
            return None
        sets = read_head_sets(self.initial_full_heads, option="initial_full_heads")
        if model_shape is not None and tuple(sets.shape) != tuple(model_shape):
            raise ConfigError(f"`initial_full_heads` {self.initial_full_heads} holds sets of shape {list(sets.shape)} "
                              f"([routed layers, KV heads]) but the model routes {list(model_shape)}: give a file "
                              "that `elastic-attention search-heads` wrote for this model")
        chosen = [_set_at(sets, msr, "head_set_choices_msrs") for msr in self.head_set_choices_msrs]
        for entry in self.head_set_choices_extra or []:
            file, msr = split_set_reference(entry, option="head_set_choices_extra")
            other = read_head_sets(file, option="head_set_choices_extra")
            if other.shape != sets.shape:
                raise ConfigError(f"`head_set_choices_extra` file {file} holds sets of shape {list(other.shape)}, "
                                  f"`initial_full_heads` {list(sets.shape)}: both must come from the same model")
            chosen.append(_set_at(other, msr, "head_set_choices_extra"))
        return torch.stack(chosen)

    def targets_between_sets(self, set_msrs: Sequence[float], entries: int) -> list[str]:
        """One line per task whose target lies strictly between two of a head-set router's sets: ``set_msrs`` the
        sets' MSRs, ``entries`` the (layer, KV head) entries of a set (a target within half an entry of a set's MSR
        counts as on it). Tasks with ``bounds`` are left out. Such a target is met only by a task's prompts
        splitting between the two neighbouring sets; once the router settles on one, its logits can be too far
        apart for the multipliers to move it back (docs/guide-train.md)."""
        lines, tolerance = [], 0.5 / entries
        for task, target in sorted(self.targets.items()):
            if task in self.bounds or any(abs(target - msr) <= tolerance for msr in set_msrs):
                continue
            below = [msr for msr in set_msrs if msr < target]
            above = [msr for msr in set_msrs if msr > target]
            if below and above:
                lines.append(f"target {target} of {task} lies between the sets at MSR {max(below):.3f} and "
                             f"{min(above):.3f}: its prompts meet it only by splitting between them; a target on a "
                             "set's MSR is met by choosing that set")
        return lines

    def _check_initial_router(self) -> None:
        """The adapter of ``initial_router`` exists and was trained with this run's ``elastic`` settings."""
        folder = Path(self.initial_router)
        if not (folder / ADAPTER_WEIGHTS).is_file():
            raise ConfigError(f"`initial_router`: no {ADAPTER_WEIGHTS} in {folder}; give the folder save_router "
                              "wrote (a finished run's router/)")
        try:
            trained = read_adapter_config(folder)
        except AdapterMismatchError as error:
            raise ConfigError(f"`initial_router`: {error}") from None
        wanted = self.elastic_config
        differences = [f"{name}={getattr(trained, name)!r} (here {getattr(wanted, name)!r})"
                       for name in (f.name for f in dataclasses.fields(ElasticConfig))
                       if getattr(trained, name) != getattr(wanted, name)]
        if differences:
            raise ConfigError(f"`initial_router` was trained with {', '.join(differences)}: set `elastic` to the "
                              f"adapter's settings ({folder / ADAPTER_CONFIG})")

    def _check_per_task_settings(self) -> None:
        if not isinstance(self.targets, dict) or not isinstance(self.bounds, dict):
            raise ConfigError("`targets` and `bounds` must be sections mapping task names to values")
        for task, target in self.targets.items():
            check_number(target, f"targets.{task}")
        for task, band in self.bounds.items():
            if not isinstance(band, (tuple, list)) or len(band) != 2:
                raise ConfigError(f"`bounds.{task}` must be a pair [lower, upper] of MSRs, got {band!r}")
            lower, upper = (check_number(value, f"bounds.{task}") for value in band)
            if lower > upper:
                raise ConfigError(f"`bounds.{task}` must have lower <= upper, got {list(band)}")

    @property
    def elastic_config(self) -> ElasticConfig:
        return ElasticConfig(**self.elastic)

    def initial_head_set(self) -> torch.Tensor | None:
        """The head set of ``initial_full_heads`` ([routed layers, Hkv] bool, True = full attention), or ``None``."""
        if self.initial_full_heads is None:
            return None
        return load_head_set(self.initial_full_heads, self.initial_full_heads_msr, option="initial_full_heads",
                             msr_option="initial_full_heads_msr")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        data = dict(data)
        unknown_keys(cls, data, "training config", ("lr", "pretraining", "pretrain"))
        if "data" in data:
            data["data"] = build_section(DataConfig, data["data"], "data")
        if "temperature" in data:
            data["temperature"] = build_section(TemperatureSchedule, data["temperature"], "temperature")
        if isinstance(data.get("bounds"), dict):
            data["bounds"] = {task: tuple(band) if isinstance(band, list) else band
                              for task, band in data["bounds"].items()}
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
        """Read a YAML file and apply ``key=value`` / ``section.key=value`` overrides (values parsed as YAML)."""
        return cls.from_dict(read_yaml(path, overrides))


def _set_at(sets, msr: float, option: str) -> torch.Tensor:
    """[routed layers, Hkv] bool: the set of ``sets`` (a `HeadSets`) at ``msr``, every head sparse at 1.0."""
    check_number(msr, f"{option}[*]")
    return torch.zeros(sets.shape, dtype=torch.bool) if msr == 1.0 else sets.at(msr, msr_option=option)

"""Router training recipe: setup / train / save_checkpoint / finish / cleanup.

One optimizer step consumes ``packs_per_step`` packs (the global batch); each pack is one forward with its samples
routed and attended separately. The loss of a pack is LM cross-entropy (answer tokens by default) plus the sparsity
objective over its samples; the step's gradient is the mean over packs, so any split of the packs over processes
gives the same update. Data order and Gumbel noise depend only on (seed, step, pack position): a resumed run
replays the uninterrupted one.

The per-token losses and the forward over a pack are in `training.losses`, a checkpoint's tensors in
`training.checkpoint`, a step's metrics in `training.metrics_log`, the schedules' position in `training.schedule`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from elastic_attention.adapters import load_router, router_state_dict, save_router
from elastic_attention.errors import ConfigError
from elastic_attention.integration import (
    attach,
    force_head_set,
    routers_of,
    routing_report,
    runtime_of,
)
from elastic_attention.integration.routing import read_router_input
from elastic_attention.io import atomic_write_text
from elastic_attention.training.checkpoint import (
    flatten_optimizer,
    load_training_state,
    save_checkpoint,
    training_state,
)
from elastic_attention.training.train_config import SUITE_SOURCES, SUITE_TARGETS, TrainConfig, check_task_names
from elastic_attention.training.plots import plot_training, write_plot
from elastic_attention.training.distributed import distributed_rank, is_sharded, shard_backbone, training_device
from elastic_attention.rows import encode_row
from elastic_attention.training.data import EPOCH_SEED_STRIDE, EpochPacks, Pack, load_rows, pack_rows
from elastic_attention.training.signal_teacher import teacher_loss, teacher_targets
# supervised_loss and supervised_token_losses are imported from here too
from elastic_attention.training.losses import (  # noqa: F401
    LM_LOSSES,
    TeacherCache,
    distillation_token_losses,
    forward_pack,
    supervised_loss,
    supervised_token_losses,
)
from elastic_attention.training.metrics_log import (
    append_metrics,
    open_tensorboard,
    progress_postfix,
    rewrite_metrics,
    step_metrics,
)
from elastic_attention.training.objective import SparsityObjective
from elastic_attention.training.run_folder import claim_run_folder, load_for_resume
from elastic_attention.training.set_losses import load_set_losses, save_set_losses
from elastic_attention.training.schedule import cosine_decay, linear_warmup, schedule_position

logger = logging.getLogger(__name__)

#: Sequences whose pooled keys set a standardizing router's input statistics before the first step.
CALIBRATION_SEQUENCES = 64


class RouterTrainer:
    """Trains the routers of a frozen backbone with the paper's objective.

    Args:
        config: the run configuration.
        progress: show a progress bar (rank 0 only).
    """

    def __init__(self, config: TrainConfig, progress: bool = True) -> None:
        self.config = config
        self.progress = progress
        self.output_dir = Path(config.output_dir)
        self.rank, self.world_size = distributed_rank()
        self.step = 0
        self.train_seconds = 0.0  # seconds spent in training steps, over resumes too
        #: of those, seconds of the no-grad forwards that fill a pack's set losses at its first visit (later visits
        #: reuse them, so they say nothing of what the remaining steps cost), and how many packs they filled
        self.first_visit_seconds = 0.0
        self.first_visits = 0
        self._first_visit_step: dict[int, int] | None = None
        self.history: list[dict] = []
        self._lock = None

    # -- setup -------------------------------------------------------------------------------------------------

    def setup(self, resume: bool = False, overwrite: bool = False) -> None:
        """Claim the run folder, load the backbone, attach routers, build data, objective and optimizer; resume if
        asked (see `claim_run_folder`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = self.config
        self._lock = claim_run_folder(self.output_dir, resume=resume, overwrite=overwrite, is_main=self.rank == 0)
        self.device = training_device(config.device, self.rank)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        torch.manual_seed(config.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype).to(self.device)
        attach(model, config.elastic_config)
        routers = routers_of(model)
        for router in routers.values():
            router.float()
        if config.initial_router is not None:  # before sharding; a resumed run's checkpoint replaces it
            load_router(model, config.initial_router)  # its elastic settings are this run's (TrainConfig checks)
        choices = config.head_set_choices((len(runtime_of(model).routed_layers), runtime_of(model).num_kv_heads))
        if choices is not None:  # before sharding; a resumed run's checkpoint replaces them
            routers[min(routers)].set_head_sets(choices.to(self.device))
            if self.rank == 0:
                set_msrs = routers[min(routers)].set_msrs().tolist()
                for line in config.targets_between_sets(set_msrs, choices[0].numel()):
                    logger.warning(line)
        if config.initial_full_probability is not None:  # before sharding; a resumed run's checkpoint replaces it
            self._set_initial_routing([routers[index] for index in sorted(routers)])
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if config.distributed == "fsdp":
            shard_backbone(model, config.fsdp_reshard_after_forward)
        self.model = model.train()
        self.runtime = runtime_of(model)
        self.objective = SparsityObjective(config.targets, config.linear_term, config.bounds).to(self.device)
        self.router_parameters = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in self.router_parameters if p.ndim >= 2]
        no_decay = [p for p in self.router_parameters if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "lr": config.router_lr, "weight_decay": config.weight_decay},
                {"params": no_decay, "lr": config.router_lr, "weight_decay": 0.0},
                {"params": list(self.objective.parameters()), "lr": config.multiplier_lr, "weight_decay": 0.0,
                 "maximize": True},
            ],
            betas=(0.9, 0.95),
        )
        self.packs = self._build_packs()
        self.epochs = EpochPacks(self.packs, self._build_packs if config.data.fresh_rows else None)
        self.lm_loss = LM_LOSSES[config.lm_loss]
        self.teacher_cache = None
        #: ``head_set_objective: expected``: id(pack) -> `_pack_under_each_set`'s result. The backbone is frozen and
        #: the sets are fixed, so a pack's are the same at every visit: its C forwards run at its first visit only.
        self.set_losses: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        if config.set_losses_file is not None:
            self.set_losses, pooling = load_set_losses(config.set_losses_file, self.packs, self._head_sets())
            logger.info("%d of %d packs' losses under each set read from %s", len(self.set_losses),
                        len(self.packs), config.set_losses_file)
            if pooling != self._router_pooling():
                self._read_router_inputs_again(pooling)
        if config.lm_loss == "distillation" and config.teacher_cache:
            self.teacher_cache = TeacherCache()
            self.lm_loss = functools.partial(distillation_token_losses, teacher_cache=self.teacher_cache)
        restored = self._restore() if resume else False
        if config.elastic_config.router_standardize and not restored and config.initial_router is None:
            self._calibrate_routers()  # an initial adapter brings the statistics its weights were trained on
        for router in routers_of(model).values():
            router.margin_limit = config.margin_limit

    def _set_initial_routing(self, routers: list) -> None:
        """Start every router at ``initial_full_probability``, or, with ``initial_full_heads``, its set's heads at
        that P(full) and the other heads at 1 minus it (pinned to sparse attention with
        ``sparse_outside_initial_heads``); a head-set router chooses its fullest set with that probability."""
        probability = self.config.initial_full_probability
        head_set = None if routers[0].choices else self.config.initial_head_set()
        if head_set is None:  # a head-set router: its fullest set at that probability
            for router in routers:
                router.set_full_probability(probability)
            return
        shape = (len(routers), routers[0].num_kv_heads)
        if tuple(head_set.shape) != shape:
            raise ConfigError(f"`initial_full_heads`: the set is {tuple(head_set.shape)} ([layers, KV heads]) but "
                              f"the model routes {shape}: search the head set on this model")
        for router, full in zip(routers, head_set):
            router.set_full_probability(torch.where(full, probability, 1.0 - probability))
            if self.config.sparse_outside_initial_heads:
                router.pin_sparse(~full)

    def _calibrate_routers(self) -> None:
        """Set the standardizing routers' per-head input statistics from the first packs.

        Every process runs the same packs (``CALIBRATION_SEQUENCES`` sequences or all there are), so the statistics
        agree across processes without communication, and a sharded backbone sees matching forwards on every rank.
        """
        routers = routers_of(self.model)
        first = self._calibration_packs()
        if first and all(id(pack) in self.set_losses for pack in first):  # what the router read: no forward
            (router,) = routers.values()
            router.set_feature_statistics(torch.cat([self.set_losses[id(pack)][1] for pack in first]).to(self.device))
            logger.info("router inputs standardized from %d sequences of the set_losses file",
                        sum(len(pack.tasks) for pack in first))
            return
        recorded: dict[int, list[torch.Tensor]] = {index: [] for index in routers}
        hooks = [
            router.register_forward_pre_hook(
                lambda module, args, index=index: recorded[index].append(args[0].detach().float().cpu())
            )
            for index, router in routers.items()
        ]
        self.model.eval()
        try:
            with torch.no_grad():
                for pack in first:
                    forward_pack(self.model, pack, self.device, logits_to_keep=1)
        finally:
            for hook in hooks:
                hook.remove()
            self.model.train()
        for index, router in routers.items():
            router.set_feature_statistics(torch.cat(recorded[index]).to(self.device))
        logger.info("router inputs standardized from %d sequences", sum(len(pack.tasks) for pack in first))

    def _calibration_packs(self) -> list[Pack]:
        """The first packs, up to `CALIBRATION_SEQUENCES` sequences (the pack that reaches it included)."""
        first, sequences = [], 0
        for pack in self.packs:
            if sequences >= CALIBRATION_SEQUENCES:
                break
            first.append(pack)
            sequences += len(pack.tasks)
        return first

    def _router_pooling(self) -> tuple[int, int]:
        elastic = self.config.elastic_config
        return elastic.pool_first, elastic.pool_last

    def _read_router_inputs_again(self, pooling: tuple[int, int] | None) -> None:
        """Replace the router inputs of the packs read from ``set_losses_file``, pooled with ``pooling`` (None: the
        file does not say), by this run's (`read_router_input`: each pack's forward stops at the router)."""
        read = "with unrecorded spans" if pooling is None else f"over {pooling[0]} + {pooling[1]} tokens"
        ours = "{} + {} tokens".format(*self._router_pooling())
        if self.config.distributed == "fsdp":
            raise ConfigError(f"set_losses_file {self.config.set_losses_file} holds router inputs pooled {read}, this "
                              f"run pools {ours}: reading them again would stop sharded forwards midway; run it "
                              "without `distributed: fsdp`")
        (router,) = routers_of(self.model).values()
        self.model.eval()
        try:
            for pack in self.packs:
                if id(pack) in self.set_losses:
                    losses, _, tokens = self.set_losses[id(pack)]
                    router_input = read_router_input(
                        router, lambda: forward_pack(self.model, pack, self.device, logits_to_keep=1))
                    self.set_losses[id(pack)] = (losses, router_input, tokens)
        finally:
            self.model.train()
        logger.info("router inputs of %d packs read again: the file's were pooled %s, this run pools %s",
                    len(self.set_losses), read, ours)

    def _head_sets(self) -> torch.Tensor:
        """[C, R, Hkv] the sets of the head-set router (``head_set_objective: expected`` trains one)."""
        (router,) = routers_of(self.model).values()
        return router.head_sets

    def _build_packs(self, epoch: int = 0) -> list[Pack]:
        """The packs of the data's rows; suites draw epoch ``epoch``'s rows (`EpochPacks`)."""
        data = self.config.data
        if data.source in SUITE_SOURCES:
            from elastic_attention.evaluation.suites import get_suite

            suite = get_suite(SUITE_SOURCES[data.source])
            per_cell = math.ceil(data.rows / (len(data.tasks) * len(data.lengths)))
            seed = data.seed + epoch * EPOCH_SEED_STRIDE
            cells = [suite.generate(task, length, seed, per_cell, self.tokenizer)
                     for length in data.lengths for task in data.tasks]
            rows = [cell[index] for index in range(per_cell) for cell in cells][: data.rows]
        else:
            rows = load_rows(data.source)
            named = {"bounds": self.config.bounds}
            if self.config.targets != SUITE_TARGETS:  # the untouched default names every synthetic suite task
                named["targets"] = self.config.targets
            check_task_names(named, [row.task for row in rows], f"in the rows of {data.source}")
        self.objective.task_indices([row.task for row in rows])
        encoded = [encode_row(self.tokenizer, row) for row in rows]
        packs = pack_rows(encoded, data.budget, answer_only=data.answer_only, on_overlong=data.on_overlong)
        if len(packs) < self.world_size:
            raise ValueError(f"only {len(packs)} packs for {self.world_size} processes; add rows")
        return packs

    # -- training ----------------------------------------------------------------------------------------------

    def step_packs(self, step: int) -> list[Pack]:
        """The packs of ``step``, in `pack_order`'s order, each from its epoch's rows (`EpochPacks`)."""
        first = step * self.config.packs_per_step
        return [self.epochs.of((first + offset) // len(self.packs))[index]
                for offset, index in enumerate(self.pack_order(step))]

    def pack_order(self, step: int) -> list[int]:
        """Global pack indices of ``step``: an epoch-wise permutation seeded by (seed, epoch)."""
        per_step, count = self.config.packs_per_step, len(self.packs)
        positions = range(step * per_step, (step + 1) * per_step)
        permutations: dict[int, torch.Tensor] = {}
        order = []
        for position in positions:
            epoch, offset = divmod(position, count)
            if epoch not in permutations:
                generator = torch.Generator().manual_seed(self.config.data.seed + epoch)
                permutations[epoch] = torch.randperm(count, generator=generator)
            order.append(int(permutations[epoch][offset]))
        return order

    def train(self) -> dict:
        """Run the remaining steps; returns the run summary."""
        config = self.config
        bar = self._bar()
        writer = open_tensorboard(self.output_dir, self.step) if self.rank == 0 else None
        started, seconds_before = time.perf_counter(), self.train_seconds
        step_seconds, step_tokens = [], []
        stopped_by = "steps"
        while self.step < config.steps:
            (self.train_seconds,) = self._agreed_seconds(seconds_before + time.perf_counter() - started)
            if config.max_seconds is not None and self.train_seconds >= config.max_seconds:
                stopped_by = "max_seconds"
                break
            began = time.perf_counter()
            metrics = self.train_step()
            step_seconds.append(time.perf_counter() - began)
            step_tokens.append(sum(pack.input_ids.numel() for pack in self.step_packs(self.step)))
            self.history.append(metrics)
            if self.rank == 0:
                append_metrics(self.output_dir / "metrics.csv", metrics, writer)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(progress_postfix(metrics))
            self.step += 1
            if config.checkpoint_every and self.step % config.checkpoint_every == 0 and self.step < config.steps:
                self.train_seconds = seconds_before + time.perf_counter() - started
                self.save_checkpoint()
        self.train_seconds = seconds_before + time.perf_counter() - started
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        if stopped_by == "max_seconds":
            logger.info("stopped by max_seconds (%g s) after %d of %d steps", config.max_seconds, self.step,
                        config.steps)
        summary = {"steps": self.step, "stopped_by": stopped_by, "seconds": time.perf_counter() - started,
                   "train_seconds": self.train_seconds, "final": self.history[-1] if self.history else {},
                   "tokens": sum(step_tokens)}
        if len(step_seconds) > 1:
            # The first step compiles kernels and warms caches; throughput is measured over the others.
            summary["tokens_per_second"] = sum(step_tokens[1:]) / sum(step_seconds[1:])
        if self.device.type == "cuda":
            summary["peak_memory_bytes"] = torch.cuda.max_memory_allocated(self.device)
        if self.teacher_cache is not None:
            summary["teacher_cache_bytes"] = 4 * self.teacher_cache.values
        if self.config.head_set_objective == "expected":
            summary["packs_run_under_each_set"] = len(self.set_losses)  # on this process, or read from the file
            summary["first_visit_seconds"] = self.first_visit_seconds
        return summary

    def _agreed_seconds(self, *seconds: float) -> tuple[float, ...]:
        """Rank 0's values of ``seconds`` on every process, so that all stop at the same step and follow the same
        schedules (one broadcast a call, only under a time budget)."""
        if self.world_size > 1 and self.config.max_seconds is not None:
            value = torch.tensor(seconds, dtype=torch.float64, device=self.device)
            dist.broadcast(value, src=0)
            seconds = tuple(value.tolist())
        return seconds

    def schedule_step(self) -> float:
        """Where the schedules stand, in steps: ``self.step``, or further when the time budget is ahead of it. See
        `schedule_position`."""
        if self.config.max_seconds is None:
            return float(self.step)
        spent, pending = self._agreed_seconds(self.first_visit_seconds, self._pending_first_visit_seconds())
        return schedule_position(self.step, self.config.steps, self.train_seconds, self.config.max_seconds, spent,
                                 pending)

    def _pending_first_visit_seconds(self) -> float:
        """Seconds the first visits still ahead of this process will take, at the mean cost of those done so far
        (0 before the first, and when no pack is left to visit)."""
        if self.config.head_set_objective != "expected" or not self.first_visits:
            return 0.0
        if self._first_visit_step is None:  # pack -> the step that first visits it on this process, once
            self._first_visit_step = {}
            for step in range(self.config.steps):
                for position, index in enumerate(self.pack_order(step)):
                    if position % self.world_size == self.rank:
                        self._first_visit_step.setdefault(index, step)
                if len(self._first_visit_step) == len(self.packs):
                    break
        pending = sum(1 for index, step in self._first_visit_step.items()
                      if step >= self.step and id(self.packs[index]) not in self.set_losses)
        return self.first_visit_seconds / self.first_visits * pending

    def train_step(self) -> dict:
        """One optimizer step over the packs of ``self.step`` that belong to this process."""
        config = self.config
        schedule_at = self.schedule_step()
        temperature = config.temperature.at(schedule_at, config.steps)
        for router in routers_of(self.model).values():
            router.temperature = temperature
        scale = self._lr_scale(schedule_at)
        for group in self.optimizer.param_groups[:2]:
            group["lr"] = config.router_lr * scale
        self.optimizer.zero_grad(set_to_none=True)
        order = self.step_packs(self.step)
        sums: dict[str, float] = defaultdict(float)
        task_msr: dict[str, list[float]] = defaultdict(list)
        task_lm: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # task -> [summed token loss, tokens]
        for position, pack in enumerate(order):
            if position % self.world_size != self.rank:
                continue
            noise_seed = config.seed * 1_000_003 + self.step * 1009 + position
            teacher = zero = torch.zeros((), device=self.device)
            if config.router_objective != "paper":
                teacher, msr = teacher_loss(self.model, *teacher_targets(
                    self.model, pack, self.device, config.signal_teacher_threshold, config.signal_teacher_layer))
                sums["teacher_loss"] += float(teacher.detach())
            if config.router_objective == "signal_teacher":  # no LM term, no MSR targets: the teacher alone
                lm_loss, regularisation, per_sample, tokens = zero, zero, torch.zeros(len(pack.tasks)), None
            else:
                lm_loss, msr, per_sample, tokens = self._pack_terms(pack, noise_seed)
                regularisation = self.objective(msr, self.objective.task_indices(pack.tasks))
            # Every process scales by world / packs: averaging gradients over processes (FSDP's reduce-scatter, the
            # all-reduce below) then yields the mean over the step's packs, however they are split.
            weight = config.signal_teacher_weight if config.router_objective == "both" else 1.0
            loss = (lm_loss + regularisation + weight * teacher) * self.world_size / len(order)
            loss.backward()
            sums["lm_loss"] += float(lm_loss.detach())
            sums["reg_loss"] += float(regularisation.detach())
            for task, value in zip(pack.tasks, msr.tolist()):
                task_msr[task].append(value)
            for task, total, supervised in zip(pack.tasks, per_sample.tolist(), ([] if tokens is None
                                                                                 else tokens.tolist())):
                task_lm[task][0] += total
                task_lm[task][1] += supervised
        self._reduce_gradients()
        if config.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.router_parameters, config.grad_clip)
        self.optimizer.step()
        return step_metrics(self.step + 1, sums, task_msr, task_lm, len(order), self.objective, self.device,
                            temperature=temperature, lr=config.router_lr * scale)

    def _pack_terms(self, pack: Pack, noise_seed: int):
        """One pack's LM term (scalar), each sample's MSR ([N], both with the routers' gradient), and each sample's
        summed token loss and supervised tokens ([N] float64 and int64 on the CPU, for the logs)."""
        if self.config.head_set_objective == "expected":
            return self._expected_pack_terms(pack)
        token_losses, samples = self.lm_loss(self.model, pack, self.device, noise_seed=noise_seed)
        count = len(pack.tasks)
        per_sample = torch.bincount(samples, weights=token_losses.detach().cpu().double(), minlength=count)
        return token_losses.mean(), routing_report(self.model).msr, per_sample, torch.bincount(samples, minlength=count)

    def _expected_pack_terms(self, pack: Pack):
        """`_pack_terms` under ``head_set_objective: expected``: the LM term and MSRs are expectations under the
        router's softmax at its temperature, LM = sum over samples n and sets c of p[n, c] * L[n, c] / K (L: the
        sample's summed token loss under set c, K: the pack's supervised tokens, so under hard choices it is the
        sampled objective's token mean) and MSR[n] = sum over c of p[n, c] * MSR(c). L and what the router reads
        come from `_pack_under_each_set` at the pack's first visit, from ``set_losses`` at the later ones."""
        (router,) = routers_of(self.model).values()
        if id(pack) not in self.set_losses:
            began = time.perf_counter()
            self.set_losses[id(pack)] = self._pack_under_each_set(pack)
            self.first_visit_seconds += time.perf_counter() - began
            self.first_visits += 1
        losses, router_input, tokens = self.set_losses[id(pack)]
        probabilities = torch.softmax(router.choice_logits(router_input.to(self.device)) / router.temperature, dim=-1)
        losses = losses.to(self.device)
        lm_loss = (probabilities * losses).sum() / tokens.sum()
        per_sample = (probabilities.detach() * losses).sum(dim=1).cpu().double()
        return lm_loss, probabilities @ router.set_msrs().to(probabilities.dtype), per_sample, tokens

    def _pack_under_each_set(self, pack: Pack):
        """([N, C] float32 summed token loss of each sample under each head set, [N, Hkv, D] what the router reads
        for them, [N] int64 supervised tokens), all on the CPU: C forwards without gradients."""
        (router,) = routers_of(self.model).values()
        routing = runtime_of(self.model).routing
        count = len(pack.tasks)
        summed = []
        try:
            for index in range(router.choices):
                force_head_set(self.model, index)
                with torch.no_grad():
                    token_losses, samples = self.lm_loss(self.model, pack, self.device)
                summed.append(torch.bincount(samples, weights=token_losses.double().cpu(), minlength=count))
        finally:
            force_head_set(self.model, None)
        return (torch.stack(summed, dim=1).float(), routing.set_router_input.float().cpu(),
                torch.bincount(samples, minlength=count))

    def _lr_scale(self, step: float) -> float:
        warmup = round(self.config.warmup_fraction * self.config.steps)
        if step < warmup:
            return linear_warmup(step, warmup)
        if self.config.lr_schedule == "constant":
            return 1.0
        return cosine_decay((step - warmup) / max(1, self.config.steps - warmup))

    def _reduce_gradients(self) -> None:
        if self.world_size == 1:
            return
        for parameter in [*self.router_parameters, *self.objective.parameters()]:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            if not is_sharded(parameter):
                dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
                parameter.grad.div_(self.world_size)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint of the routers, multipliers, optimizer and metric history (rank 0)."""
        tensors = training_state(self.model, self.objective, self.optimizer)
        if self.rank != 0:
            return None
        _, groups = flatten_optimizer(self.optimizer.state_dict())
        scalars = {"param_groups": groups, "history": self.history, "config": self.config.to_dict(),
                   "train_seconds": self.train_seconds, "first_visit_seconds": self.first_visit_seconds,
                   "first_visits": self.first_visits}
        return save_checkpoint(self.output_dir / "checkpoints", self.step, tensors, scalars)

    def _restore(self) -> bool:
        """Load the latest checkpoint; False when there is none."""
        found = load_for_resume(self.output_dir, self.config.to_dict())
        if found is None:
            return False
        step, tensors, scalars = found
        load_training_state(self.model, self.objective, self.optimizer, tensors, scalars["param_groups"])
        self.step, self.history = step, scalars["history"]
        self.train_seconds = scalars.get("train_seconds", 0.0)  # absent in checkpoints written before max_seconds
        self.first_visit_seconds = scalars.get("first_visit_seconds", 0.0)
        self.first_visits = scalars.get("first_visits", 0)
        if self.rank == 0:
            rewrite_metrics(self.output_dir / "metrics.csv", self.history)
        logger.info("resumed from step %d", step)
        return True

    # -- outputs -----------------------------------------------------------------------------------------------

    def finish(self, summary: dict) -> dict:
        """Save the router adapter, the summary and the plots (rank 0)."""
        state = router_state_dict(self.model)
        if self.rank != 0:
            return summary
        adapter = save_router(self.model, self.output_dir / "router", state, overwrite=True)  # this run's folder
        summary = {**summary, "adapter": str(adapter), "config": self.config.to_dict()}
        if self.set_losses:
            summary["set_losses"] = str(save_set_losses(self.output_dir / "set_losses.safetensors", self.packs,
                                                        self.set_losses, self._head_sets(),
                                                        self._router_pooling()))
        atomic_write_text(self.output_dir / "summary.json", json.dumps(summary, indent=2))
        write_plot(plot_training, self.history, self.output_dir)
        return summary

    def cleanup(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _bar(self):
        if not self.progress or self.rank != 0:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.config.steps, initial=self.step, desc="train routers", unit="step")


def train(config: TrainConfig, resume: bool = False, progress: bool = True, overwrite: bool = False) -> dict:
    """Set up, train, save and clean up: the whole recipe. Returns the run summary.

    ``resume`` continues the run in ``config.output_dir`` from its latest checkpoint (the settings must match);
    ``overwrite`` replaces a previous run there. A folder holding another run is refused otherwise.
    """
    trainer = RouterTrainer(config, progress=progress)
    try:
        trainer.setup(resume=resume, overwrite=overwrite)
        summary = trainer.train()
        if config.checkpoint_every:
            trainer.save_checkpoint()
        summary = trainer.finish(summary)
        if trainer.world_size > 1 and dist.is_initialized():
            # Ranks other than 0 return from finish at once; tearing the group down while rank 0 still writes its
            # files aborted a gloo process now and then ("terminate called without an active exception").
            dist.barrier()
        return summary
    finally:
        trainer.cleanup()


def enable_gradient_checkpointing(model) -> None:
    """Recompute every decoder layer in the backward pass (non-reentrant, so frozen inputs are fine)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

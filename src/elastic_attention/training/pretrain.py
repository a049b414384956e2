"""Backbone pretraining recipe: setup / train / save_checkpoint / finish / cleanup.

Trains a small Qwen3 (`training.backbone`) from scratch on the synthetic suite's step batches
(`training.pretrain_data`): one process, one device. The loss is the mean of the suite-answer loss and the
dense-query loss (each a per-token mean over the supervised tokens), so the few suite-answer tokens are not drowned
by the many dense ones. AdamW (0.9, 0.95), weight decay on matrices only, linear warm-up over ``warmup_steps``
scaling a cosine to ``min_lr_ratio`` of the peak whose progress is the larger of ``elapsed / max_seconds`` and
``step / max_steps``; bf16 autocast on CUDA, gradient clipping, optional ``torch.compile``.

The run folder holds ``model/`` (bf16 safetensors, the tokenizer, a generation config and ``train_summary.json``:
what ``src/elastic_attention/assets/backbone_tiny`` ships), ``summary.json``, ``metrics.csv`` (the logged steps),
``training.png`` and ``checkpoints/``. A checkpoint holds the float32 weights, the optimizer, the step, the tokens
and the training seconds so far; batches are a function of (seed, step), so a resumed run replays the data of the
uninterrupted one (and, with a step budget alone, its weights).

    elastic-attention pretrain configs/backbone_tiny.yaml [KEY=VALUE ...] [--resume | --overwrite]
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from elastic_attention.errors import ConfigError
from elastic_attention.io import atomic_write_text
from elastic_attention.training.backbone import build_backbone, build_backbone_config, save_backbone
from elastic_attention.training.checkpoint import flatten_optimizer, save_checkpoint, unflatten_optimizer
from elastic_attention.training.data import IGNORE_INDEX
from elastic_attention.training.distributed import training_device
from elastic_attention.training.metrics_log import append_metrics, open_tensorboard, rewrite_metrics
from elastic_attention.training.pretrain_config import PRETRAIN_RESUMABLE, PretrainConfig
from elastic_attention.training.pretrain_data import StepBatches
from elastic_attention.training.pretrain_eval import dense_query_accuracy, evaluate_tasks
from elastic_attention.training.plots import plot_pretraining, write_plot
from elastic_attention.training.run_folder import MODEL_STAGING, claim_run_folder, load_for_resume
from elastic_attention.training.schedule import cosine_decay, linear_warmup

logger = logging.getLogger(__name__)

#: What a pretraining run writes into its folder.
PRETRAIN_RUN_ENTRIES = ("model", "checkpoints", "metrics.csv", "summary.json", "tensorboard", "training.png")

#: The loss columns of metrics.csv: the step's losses and argmax accuracies (NaN for a part the step has no token
#: of). The other columns: ``step``, ``lr``, ``length`` and ``sequences`` (the step's sequence length and count),
#: ``tokens_per_second`` (since the previous logged step) and ``seconds`` (of training so far).
LOSS_COLUMNS = ("loss", "suite", "suite_accuracy", "dense", "dense_accuracy", "lm")


class PretrainRecipe:
    """Pretrains a backbone from scratch.

    Args:
        config: the run configuration.
        progress: show a progress bar.
    """

    def __init__(self, config: PretrainConfig, progress: bool = True) -> None:
        self.config = config
        self.progress = progress
        self.output_dir = Path(config.output_dir)
        self.step = 0
        self.tokens = 0
        self.supervised_tokens = 0
        self.train_seconds = 0.0
        self.history: list[dict] = []
        self.started = time.perf_counter()
        self._open: list[Any] = []  # the loader, progress bar and tensorboard writer of `train`, for `cleanup`
        self._lock = None  # the run folder's, held from `setup` to `cleanup`

    # -- setup -------------------------------------------------------------------------------------------------

    def setup(self, resume: bool = False, overwrite: bool = False) -> None:
        """Claim the run folder, build the tokenizer, model and optimizer; resume if asked (see `claim_run_folder`).

        Raises:
            ConfigError: started under torchrun, CUDA asked for where there is none, or the folder or checkpoint
                does not fit (see `claim_run_folder`, `check_resumable`).
        """
        from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer

        config = self.config
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("pretraining runs in one process on one device; start it without torchrun")
        if config.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("`device` is cuda but torch sees no CUDA device; set device=cpu or device=auto")
        self._lock = claim_run_folder(self.output_dir, resume=resume, overwrite=overwrite, is_main=True,
                                      entries=PRETRAIN_RUN_ENTRIES)
        self.device = training_device(config.device, 0)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.tokenizer = build_tokenizer()
        longest = max(config.data.max_len, config.eval.length)
        self.backbone_config = build_backbone_config(config.model, self.tokenizer, longest)
        self.model = build_backbone(self.backbone_config, self.device, config.model.qk_norm_init, config.seed)
        self.optimizer = build_optimizer(self.model, config.weight_decay, config.lr, fused=self.device.type == "cuda")
        self.decoder = torch.compile(self.model.model, dynamic=True) if config.compile else self.model.model
        if resume:
            self._restore()
        budget = [] if config.max_steps is None else [f"{config.max_steps} steps"]
        budget += [] if config.max_seconds is None else [f"{config.max_seconds:g} s"]
        logger.info("%s parameters on %s; up to %d tokens per sequence, %d tokens per step; budget %s",
                    f"{sum(p.numel() for p in self.model.parameters()):,}", self.device, config.data.max_len,
                    config.data.tokens_per_step, " or ".join(budget))

    # -- training ----------------------------------------------------------------------------------------------

    def train(self) -> dict:
        """Run steps until ``max_steps`` or ``max_seconds`` of training; returns step, token and time counts."""
        config = self.config
        on_cuda = self.device.type == "cuda"
        loader = torch.utils.data.DataLoader(
            StepBatches(config.data, config.seed, self.tokenizer, start_step=self.step),
            batch_size=None,
            num_workers=config.num_workers,
            pin_memory=on_cuda,
            prefetch_factor=4 if config.num_workers else None,
            persistent_workers=False,
        )
        bar = self._bar()
        writer = open_tensorboard(self.output_dir, self.step)
        self._open = [loader, bar, writer]
        self.model.train()
        window_tokens, window_start = 0, time.perf_counter()
        start, seconds_before = time.perf_counter(), self.train_seconds
        for input_ids, labels, is_suite in loader:
            elapsed = seconds_before + time.perf_counter() - start
            if (config.max_steps is not None and self.step >= config.max_steps) or (
                    config.max_seconds is not None and elapsed >= config.max_seconds):
                break
            self.supervised_tokens += int((labels != IGNORE_INDEX).sum())
            lr = learning_rate(self.step, elapsed, config)
            parts = self.train_step(input_ids, labels, is_suite, lr)
            self.step += 1
            self.tokens += input_ids.numel()
            window_tokens += input_ids.numel()
            if self.step % config.log_every == 0 or self.step == 1:
                now = time.perf_counter()
                metrics = self._metrics(parts, lr, input_ids.shape, window_tokens / (now - window_start),
                                        seconds_before + now - start)
                self.history.append(metrics)
                append_metrics(self.output_dir / "metrics.csv", metrics, writer)
                logger.info(_log_line(metrics))
                if bar is not None:
                    bar.set_postfix_str(f"loss {metrics['loss']:.4f} suite {metrics['suite']:.4f} "
                                        f"dense {metrics['dense']:.4f} len {metrics['length']}")
                window_tokens, window_start = 0, now
            if bar is not None:
                bar.update(1)
            if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                self.train_seconds = seconds_before + time.perf_counter() - start
                self.save_checkpoint()
        if on_cuda:
            torch.cuda.synchronize(self.device)
        self.train_seconds = seconds_before + time.perf_counter() - start
        self._close()
        return {
            "steps": self.step,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "train_seconds": self.train_seconds,
            "tokens_per_second": self.tokens / max(self.train_seconds, 1e-9),
            "last_logged": self.history[-1] if self.history else {},
        }

    def train_step(self, input_ids: torch.Tensor, labels: torch.Tensor, is_suite: torch.Tensor,
                   lr: float) -> dict[str, torch.Tensor]:
        """One optimizer step on a batch (``[B, L]`` ids and labels, ``[B]`` bool) at learning rate ``lr``; returns
        the loss parts (`suite_and_dense_loss`), not synchronised with the device."""
        config = self.config
        input_ids = input_ids.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        is_suite = is_suite.to(self.device, non_blocking=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            parts = suite_and_dense_loss(self.model, self.decoder, input_ids, labels, is_suite,
                                         config.dense_lm_weight)
        parts["loss"].backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return parts

    def _metrics(self, parts: dict[str, torch.Tensor], lr: float, shape: torch.Size, tokens_per_second: float,
                 seconds: float) -> dict:
        values = {name: float(value.detach()) for name, value in parts.items()}
        metrics = {"step": self.step, **{name: values.get(name, math.nan) for name in LOSS_COLUMNS}}
        metrics.update(lr=lr, length=shape[1], sequences=shape[0], tokens_per_second=tokens_per_second,
                       seconds=seconds)
        return metrics

    def _bar(self):
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.config.max_steps, initial=self.step, desc="pretrain", unit="step")

    # -- checkpoints -------------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the float32 weights, the optimizer, the counters and the metric history."""
        tensors = {f"model.{name}": p.detach() for name, p in self.model.named_parameters()}
        optimizer_tensors, groups = flatten_optimizer(self.optimizer.state_dict())
        tensors.update(optimizer_tensors)
        scalars = {"param_groups": groups, "history": self.history, "config": self.config.to_dict(),
                   "tokens": self.tokens, "supervised_tokens": self.supervised_tokens,
                   "train_seconds": self.train_seconds}
        return save_checkpoint(self.output_dir / "checkpoints", self.step, tensors, scalars)

    def _restore(self) -> bool:
        """Load the latest checkpoint; False when there is none."""
        found = load_for_resume(self.output_dir, self.config.to_dict(), PRETRAIN_RESUMABLE)
        if found is None:
            return False
        step, tensors, scalars = found
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                parameter.copy_(tensors[f"model.{name}"])
        self.optimizer.load_state_dict(unflatten_optimizer(tensors, scalars["param_groups"]))
        self.step, self.history = step, scalars["history"]
        self.tokens, self.supervised_tokens = scalars["tokens"], scalars["supervised_tokens"]
        self.train_seconds = scalars["train_seconds"]
        rewrite_metrics(self.output_dir / "metrics.csv", self.history)
        logger.info("resumed from step %d (%.1f s of training)", step, self.train_seconds)
        return True

    # -- outputs -----------------------------------------------------------------------------------------------

    def finish(self, training: dict) -> dict:
        """Save the backbone (bf16) to ``model/``, evaluate what was saved, write the summary and the plot."""
        import transformers

        config = self.config
        folder = self.output_dir / "model"
        saved = save_backbone(self.model, self.tokenizer, folder, MODEL_STAGING)
        evaluation = evaluate_tasks(self.model, self.tokenizer, config.eval, self.device)
        evaluation["dense_query_accuracy"] = dense_query_accuracy(
            self.model, self.tokenizer.get_vocab(), config.eval.length, max(8, config.eval.samples), self.device
        )
        logger.info("eval at %d tokens: dense key-matching queries %.3f; %s", config.eval.length,
                    evaluation["dense_query_accuracy"],
                    ", ".join(f"{task} {value:.3f}" for task, value in evaluation["accuracy"].items()))
        summary = {
            "config": config.to_dict(),
            "model": str(folder),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "model_config": self.backbone_config.to_dict(),
            **training,
            "eval": evaluation,
            **saved,
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "total_seconds": time.perf_counter() - self.started,
        }
        text = json.dumps(summary, indent=2, default=str)
        atomic_write_text(self.output_dir / "summary.json", text)
        atomic_write_text(folder / "train_summary.json", text)
        if self.history:
            write_plot(plot_pretraining, self.history, self.output_dir)
        return summary

    def cleanup(self) -> None:
        """Stop the data-loader workers, close the progress bar and tensorboard writer and let go of the run folder
        (after an error too)."""
        self._close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _close(self) -> None:
        for item in self._open:
            if hasattr(item, "close"):
                item.close()
        self._open = []  # the loader's workers stop when it is dropped


def pretrain(config: PretrainConfig, resume: bool = False, progress: bool = True, overwrite: bool = False) -> dict:
    """Set up, train, checkpoint, save, evaluate and clean up: the whole recipe. Returns the run summary.

    ``resume`` continues the run in ``config.output_dir`` from its latest checkpoint (the settings must match but
    for `PRETRAIN_RESUMABLE`); ``overwrite`` replaces a previous run there. A folder holding another run is refused
    otherwise.
    """
    recipe = PretrainRecipe(config, progress=progress)
    try:
        recipe.setup(resume=resume, overwrite=overwrite)
        training = recipe.train()
        if config.checkpoint_every and recipe.step % config.checkpoint_every:  # else the loop wrote this step's
            recipe.save_checkpoint()
        return recipe.finish(training)
    finally:
        recipe.cleanup()


def build_optimizer(model: torch.nn.Module, weight_decay: float, lr: float, fused: bool) -> torch.optim.Optimizer:
    """AdamW (0.9, 0.95); ``weight_decay`` on matrices only (not norms or the tied embedding)."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, parameter in model.named_parameters():
        if id(parameter) in seen or not parameter.requires_grad:
            continue
        seen.add(id(parameter))
        (decay if parameter.ndim >= 2 and "embed" not in name else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)


def learning_rate(step: int, elapsed: float, config: PretrainConfig) -> float:
    """The learning rate of 0-based ``step`` after ``elapsed`` training seconds: linear warm-up times a cosine to
    ``min_lr_ratio`` of the peak over the budget (time or steps, whichever is further)."""
    progress = elapsed / config.max_seconds if config.max_seconds else 0.0
    if config.max_steps:
        progress = max(progress, step / config.max_steps)
    return config.lr * linear_warmup(step, config.warmup_steps) * cosine_decay(progress, config.min_lr_ratio)


def suite_and_dense_loss(
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
        labels: ``[B, L]``; ``labels[b, t]`` is the target predicted from position ``t - 1``, or ``IGNORE_INDEX``.
        is_suite: ``[B]`` bool, True for suite rows.
        lm_weight: weight of an extra next-token loss on every token of the dense sequences (0 disables it).

    Returns:
        0-dim float32 tensors: ``loss`` (mean of the suite and dense per-token means, over those present, plus
        ``lm_weight * lm``), ``suite`` and ``dense`` losses, ``suite_accuracy`` and ``dense_accuracy`` (argmax
        accuracy; NaN when a source is absent), and ``lm`` when it is computed.
    """
    hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state  # [B, L, hidden]
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX  # [B, L-1]
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


def _log_line(metrics: dict) -> str:
    return (f"step {metrics['step']:6d}  len {metrics['length']:5d}x{metrics['sequences']:<3d}  "
            f"loss {metrics['loss']:.4f}  suite {metrics['suite']:.4f} ({metrics['suite_accuracy']:.3f})  "
            f"dense {metrics['dense']:.4f} ({metrics['dense_accuracy']:.3f})  lr {metrics['lr']:.2e}  "
            f"{metrics['tokens_per_second']:,.0f} tok/s  {metrics['seconds']:6.1f} s")

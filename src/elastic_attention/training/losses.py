"""The per-token losses of a pack that the router trainer minimizes (``lm_loss``: answer cross-entropy, or
distillation from the model's own full attention) and the forward over a pack they share."""

from __future__ import annotations

import torch

from elastic_attention.integration import is_attached, runtime_of
from elastic_attention.integration.runtime import NOISE_SEED_KWARG, PROMPT_LENGTHS_KWARG
from elastic_attention.training.data import IGNORE_INDEX, Pack


def supervised_loss(model, pack: Pack, device: torch.device, noise_seed: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy over the supervised tokens of ``pack`` (float32 scalar); ``noise_seed`` seeds
    the routing noise of this forward (see `forward_pack`)."""
    return supervised_token_losses(model, pack, device, noise_seed)[0].mean()


def supervised_token_losses(model, pack: Pack, device: torch.device,
                            noise_seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy of every supervised token of ``pack``: ([K] float32 on ``device``, [K] int64 index
    of each token's sample in ``pack.spans``, on the CPU).

    Logits are computed only at the positions that predict a labelled token (``logits_to_keep`` with their
    indices), never [T, vocab] for the whole pack: at long contexts and large vocabularies those would dominate memory.
    """
    targets = pack.labels[1:]
    keep = (targets != IGNORE_INDEX).nonzero().flatten()
    if keep.numel() == 0:
        raise ValueError("a pack has no supervised token; every row needs a non-empty answer")
    output = forward_pack(model, pack, device, logits_to_keep=keep.to(device), noise_seed=noise_seed)
    losses = torch.nn.functional.cross_entropy(output.logits[0].float(), targets[keep].to(device), reduction="none")
    starts = torch.tensor([start for start, _, _ in pack.spans])
    return losses, torch.bucketize(keep + 1, starts, right=True) - 1  # label position keep + 1 lies in that sample


class TeacherCache:
    """The teacher's log-probabilities at each pack's supervised tokens, kept in host memory after the pack's first
    visit. The teacher is the frozen backbone with every head on full attention, so a pack's are the same at every
    visit: one no-grad forward a pack instead of one a visit. Holds supervised tokens x vocabulary float32 values a
    pack (600 code rows of about 8.5 answer tokens over a 152K vocabulary: about 3.1 GB)."""

    def __init__(self) -> None:
        self._stored: dict[int, torch.Tensor] = {}
        #: float32 values held.
        self.values = 0

    def log_probs(self, pack: Pack, compute, device: torch.device) -> torch.Tensor:
        """``compute()``'s [K, vocab] result for ``pack`` (the packs of a run live as long as the cache), on
        ``device``, computed at the pack's first visit only."""
        stored = self._stored.get(id(pack))
        if stored is None:
            fresh = compute()
            self._stored[id(pack)] = fresh.cpu()
            self.values += fresh.numel()
            return fresh
        return stored.to(device, non_blocking=True)


def distillation_token_losses(model, pack: Pack, device: torch.device, noise_seed: int | None = None,
                              teacher_cache: TeacherCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """KL divergence from the model's own full-attention distribution to its routed one, at every supervised
    token of ``pack``: ([K] float32 on ``device``, [K] int64 index of each token's sample in ``pack.spans``).

    The teacher is a no-grad forward of the same model with every routed head on full attention (the frozen
    backbone as it was), or its result kept from an earlier visit of the pack in ``teacher_cache``; the student is
    the routed forward (``noise_seed`` seeds its routing noise), so the loss asks the routers to keep the answer's
    whole distribution, not only the probability of its tokens. A forced routing set before the call stays in force
    for the student.
    """
    from elastic_attention.integration import force_routing

    targets = pack.labels[1:]
    keep = (targets != IGNORE_INDEX).nonzero().flatten()
    if keep.numel() == 0:
        raise ValueError("a pack has no supervised token; every row needs a non-empty answer")

    def teacher_log_probs() -> torch.Tensor:
        previous = runtime_of(model).forced
        force_routing(model, "full")
        try:
            with torch.no_grad():
                logits = forward_pack(model, pack, device, logits_to_keep=keep.to(device)).logits[0].float()
        finally:
            force_routing(model, previous)
        return torch.log_softmax(logits, dim=-1)

    teacher = (teacher_log_probs() if teacher_cache is None
               else teacher_cache.log_probs(pack, teacher_log_probs, device))
    student = forward_pack(model, pack, device, logits_to_keep=keep.to(device), noise_seed=noise_seed).logits[0]
    losses = torch.nn.functional.kl_div(torch.log_softmax(student.float(), dim=-1), teacher, log_target=True,
                                        reduction="none").sum(dim=-1)
    starts = torch.tensor([start for start, _, _ in pack.spans])
    return losses, torch.bucketize(keep + 1, starts, right=True) - 1


#: ``lm_loss`` of the training config -> the per-token loss of a pack.
LM_LOSSES = {"cross_entropy": supervised_token_losses, "distillation": distillation_token_losses}


def forward_pack(model, pack: Pack, device: torch.device, logits_to_keep, noise_seed: int | None = None):
    """The model's forward over one pack (its samples apart by their position ids, no cache); with elastic attention
    attached, the routers pool each sample's prompt only, never its answer, and ``noise_seed`` (when given) seeds
    their Gumbel noise."""
    elastic = {}
    if is_attached(model):
        elastic = {PROMPT_LENGTHS_KWARG: pack.prompt_lengths, NOISE_SEED_KWARG: noise_seed}
    return model(input_ids=pack.input_ids[None].to(device), position_ids=pack.position_ids[None].to(device),
                 logits_to_keep=logits_to_keep, use_cache=False, **elastic)

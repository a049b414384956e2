"""Per-model state of elastic attention, and the attention function registered with transformers.

The model's forward is untouched. Two hooks and one registered function do the work:
- before the decoder runs (`before_decoder`): read the padding mask / packing and the cache, decide prefill or
  decode, and give eval-mode caching forwards an `ElasticCache`;
- after each routed layer's key source (k_proj or k_norm, `after_key_source`): at prefill, pool the pre-RoPE keys
  and route;
- the registered attention function (`attention`): at prefill, build block tables from the routing and call the
  backend (in training, both outputs mixed by the decision); after the prompt, attend through the cache by the
  token rule;
- after the decoder (`after_decoder`): keep the routing report of the forward.
Routing is decided once per prefill and reused by every decode step that follows.
"""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Any

import torch
from torch import nn

from transformers.integrations.sdpa_attention import sdpa_attention_forward

from elastic_attention.attached import RUNTIME_ATTRIBUTE
from elastic_attention.backends import AttentionBackend
from elastic_attention.cache.token_attention import token_attention
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import InputError
from elastic_attention.integration.families import FamilySpec
from elastic_attention.integration.report import RoutingReport
from elastic_attention.patterns import FULL, MODE_CODES, BlockTableBuilder, SequenceLayout, causal_pairs
from elastic_attention.router import AttentionRouter, boundary_pool, is_retrieval

logger = logging.getLogger(__name__)

ATTENTION_NAME = "elastic_attention"
#: The same function, for models with sliding-window layers: registered with a mask function that gives those layers
#: the model's own window mask.
WINDOWED_ATTENTION_NAME = "elastic_attention_windowed"
#: Forward keyword arguments of per-call facts (see `ElasticRuntime`).
PROMPT_LENGTHS_KWARG = "elastic_prompt_lengths"
NOISE_SEED_KWARG = "elastic_noise_seed"


class ElasticRuntime:
    """Everything elastic attention keeps for one attached model.

    Args:
        config: the attached configuration.
        family: where the model keeps its layers and key states.
        backend: computes hybrid attention from block tables.
        routers: layer index -> router, for the routed layers.
        num_kv_heads: Hkv.
        head_dim: D.
        num_layers: decoder layers of the model.
        cache_kind: ``"bounded"``: generation (and any eval-mode forward that caches) uses an `ElasticCache`;
            ``"full"``: Hugging Face's own cache, every key of every head kept.
        sliding_window: the model's window (tokens) on its sliding-window layers, None when it has none.
        sliding_layers: indices of those layers: they run the model's own attention (SDPA with the model's mask)
            and keep the model's own cache entries.

    Per-forward facts travel as keyword arguments of the model's forward (the decoder's pre-hook takes them out):

    - ``elastic_prompt_lengths`` (`PROMPT_LENGTHS_KWARG`): for a prefill whose sequences carry more than their
      prompt (a training pack: prompt, then answer), each sequence's prompt length in tokens; the routers then pool
      the prompt only, as they do at inference, and never see the answer.
    - ``elastic_noise_seed`` (`NOISE_SEED_KWARG`): the seed of this forward's Gumbel noise (train mode); without it
      the noise comes from torch's global generator.
    """

    def __init__(
        self,
        config: ElasticConfig,
        family: FamilySpec,
        backend: AttentionBackend,
        routers: dict[int, AttentionRouter],
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        cache_kind: str = "bounded",
        sliding_window: int | None = None,
        sliding_layers: frozenset[int] = frozenset(),
    ) -> None:
        self.config = config
        self.num_layers = num_layers
        self.cache_kind = cache_kind
        self.sliding_window = sliding_window
        self.sliding_layers = sliding_layers
        self.cache = None
        self.family = family
        self.backend = backend
        self.routers = routers
        self.routed_layers = tuple(sorted(routers))
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.forced: torch.Tensor | None = None
        self.noise_seed: int | None = None
        self._noise_source: torch.Generator | None = None
        self.noise_seeds: dict[int, int] = {}
        self._builder: BlockTableBuilder | None = None
        self._causal_pairs: tuple[SequenceLayout, torch.Tensor] | None = None
        self.layout: SequenceLayout | None = None
        self.prompt_lengths: list[int] | None = None
        self.decisions: dict[int, torch.Tensor] = {}
        self.pairs: dict[int, torch.Tensor] = {}
        self.report: RoutingReport | None = None
        self._decoder_parameters: list[str] | None = None
        # What attach changed, so that detach can restore it.
        self.previous_implementation: str | None = None
        self.requires_grad_before: dict[str, bool] = {}
        self.handles: list = []
        self._warned_train_mode_caching = False
        #: The thread whose forward the runtime's state belongs to (set by `before_decoder`).
        self.forward_thread: int | None = None

    # -- hooks ---------------------------------------------------------------------------------------------------

    def before_decoder(self, decoder: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Forward pre-hook of the decoder: derive the sequence layout and whether this is a prefill; at a prefill
        in eval mode with ``cache_kind="bounded"``, give the forward an `ElasticCache` in place of an empty one."""
        if self._decoder_parameters is None:
            self._decoder_parameters = list(inspect.signature(decoder.forward).parameters)
        passed = PROMPT_LENGTHS_KWARG in kwargs or NOISE_SEED_KWARG in kwargs
        prompt_lengths, noise_seed = kwargs.pop(PROMPT_LENGTHS_KWARG, None), kwargs.pop(NOISE_SEED_KWARG, None)
        bound = {**dict(zip(self._decoder_parameters, args)), **kwargs}
        inputs = bound.get("input_ids")
        if inputs is None:
            inputs = bound.get("inputs_embeds")
        if inputs is None:
            raise InputError("elastic attention needs input_ids or inputs_embeds")
        batch_size, query_len = inputs.shape[0], inputs.shape[1]
        cache = bound.get("past_key_values", bound.get("cache"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        if decoder.training and (bound.get("use_cache") or past) and not self._warned_train_mode_caching:
            self._warned_train_mode_caching = True
            logger.warning("elastic attention: the model is in train() mode, so routing samples Gumbel noise (another "
                           "routing at every call) and runs both outputs; call model.eval() to generate")
        replaced = self._choose_cache(decoder, bound, cache, past, kwargs)
        mask = bound.get("attention_mask")
        position_ids = bound.get("position_ids")
        if mask is not None:
            if mask.ndim != 2 or mask.shape[1] != past + query_len or mask.shape[0] != batch_size:
                raise InputError(
                    f"attention_mask must be 2D [batch, past + new tokens] = [{batch_size}, {past + query_len}], "
                    f"got shape {tuple(mask.shape)}"
                )
            layout = SequenceLayout.from_padding_mask(mask, query_len)
        elif past == 0 and position_ids is not None:
            layout = SequenceLayout.from_position_ids(position_ids.expand(batch_size, -1))
        else:
            layout = SequenceLayout.dense(batch_size, past + query_len, query_len)
        if not layout.is_prefill:
            if prompt_lengths is not None or noise_seed is not None:
                raise InputError(f"{PROMPT_LENGTHS_KWARG} and {NOISE_SEED_KWARG} apply to a prefill, not to a decode "
                                 "step")
            if not self.decisions:
                raise InputError("a decode step arrived before any prefill; run the prompt through the model first")
            routed = next(iter(self.decisions.values()))
            if routed.shape[0] != layout.num_sequences:
                raise InputError(
                    f"this decode step has {layout.num_sequences} sequences but the prefill routed "
                    f"{routed.shape[0]}; the batch must keep its rows from prefill to the last decode step "
                    "(rows cannot be dropped or added between them)"
                )
        else:
            self.decisions = {}
            self.pairs = {}
            self.noise_seeds = {}
            # Kept for the whole forward and its backward (a recomputed layer pools the same tokens and draws the
            # same noise).
            self.prompt_lengths, self.noise_seed, self._noise_source = prompt_lengths, noise_seed, None
        self.layout = layout
        if self.cache is not None:
            self.cache.begin_forward(layout)
        self.forward_thread = threading.get_ident()
        return (args, kwargs) if replaced or passed else None

    def _choose_cache(self, decoder: nn.Module, bound: dict, cache, past: int, kwargs: dict) -> bool:
        """Set ``self.cache`` for this forward; returns True when ``kwargs`` now carries a new `ElasticCache`."""
        from elastic_attention.cache import ElasticCache

        if isinstance(cache, ElasticCache):
            if cache.runtime is not self:
                raise InputError("this ElasticCache belongs to another model; create one per model")
            self.cache = cache
            return False
        self.cache = None
        use_cache = bound.get("use_cache")
        if use_cache is None:
            use_cache = getattr(decoder.config, "use_cache", True)
        if self.cache_kind != "bounded" or decoder.training or not use_cache or past != 0:
            return False
        # transformers renamed the decoder's `past_key_values` argument to `cache`; use whichever the call uses.
        names = [name for name in ("cache", "past_key_values") if name in kwargs]
        if not names:
            if cache is not None:
                return False
            names = ["cache" if "cache" in self._decoder_parameters else "past_key_values"]
        self.cache = ElasticCache(self)
        kwargs[names[0]] = self.cache
        return True

    def select_sequences(self, index: torch.Tensor) -> None:
        """Keep the routing of the sequences at ``index`` ([N'] int64, repeats allowed), in that order: what a cache
        that was reordered (beam search), repeated or trimmed along the batch needs for its later decode steps."""
        self.decisions = {layer: z.index_select(0, index.to(z.device)) for layer, z in self.decisions.items()}
        self.pairs = {layer: p.index_select(0, index.to(p.device)) for layer, p in self.pairs.items()}

    def streaming_heads(self, layer_index: int, sequence: int, num_kv_heads: int) -> torch.Tensor:
        """[Hkv] bool: the KV heads of ``sequence`` that run SSA in ``layer_index`` (and so keep a bounded cache)."""
        z = self.decisions.get(layer_index)
        if z is None:
            return torch.zeros(num_kv_heads, dtype=torch.bool)
        return self._streaming(z[sequence : sequence + 1])[0].cpu()

    def _streaming(self, z: torch.Tensor) -> torch.Tensor:
        """[N, Hkv] bool: the heads that stream (SSA keeps its sink and window; XA heads read every block)."""
        if self.config.sparse_mode != "ssa":
            return torch.zeros(z.shape, dtype=torch.bool, device=z.device)
        return ~is_retrieval(z)

    def after_key_source(self, layer_index: int, output: torch.Tensor) -> None:
        """Forward hook of a routed layer's key source: route at prefill.

        A layer recomputed in the backward pass (gradient checkpointing) routes again with the same Gumbel noise, so
        the recomputation reproduces the forward exactly.
        """
        layout = self.layout
        if layout is None or not layout.is_prefill:
            return
        layout_of_keys = self.family.key_layout
        if layout_of_keys == "flat":
            keys = output.unflatten(-1, (-1, self.head_dim))
        else:
            keys = output.transpose(1, 2) if layout_of_keys == "heads_tokens" else output
        if self.forced is not None:
            z = self.forced[self.routed_layers.index(layer_index)].to(keys.device, torch.float32)
            z = z.expand(layout.num_sequences, -1)
        else:
            router = self.routers[layer_index]
            pooled = boundary_pool(keys, layout, self.config.pool_first, self.config.pool_last, self.prompt_lengths)
            z = router(pooled, generator=self._noise_generator(layer_index, keys.device) if router.training else None)
        self.decisions[layer_index] = z
        if self.cache is not None:
            self.cache.route_layer(layer_index, self._streaming(z))

    def _noise_generator(self, layer_index: int, device: torch.device) -> torch.Generator:
        """The Gumbel-noise generator of a layer: its seed drawn once per forward, from the forward's
        ``elastic_noise_seed`` when given (else from torch's global generator)."""
        seed = self.noise_seeds.get(layer_index)
        if seed is None:
            if self.noise_seed is not None and self._noise_source is None:
                self._noise_source = torch.Generator(device).manual_seed(self.noise_seed)
            source = self._noise_source
            seed = int(torch.randint(0, 2**62, (1,), generator=source, device=source.device if source else "cpu"))
            self.noise_seeds[layer_index] = seed
        return torch.Generator(device).manual_seed(seed)

    def after_decoder(self, decoder: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """Forward hook of the decoder: publish the routing report of a prefill; let go of this forward's cache (the
        caller holds it, through the model's output)."""
        self.cache = None
        layout = self.layout
        if layout is None or not layout.is_prefill or not self.decisions:
            return
        z = torch.stack([self.decisions[index] for index in self.routed_layers], dim=1)
        esr = torch.stack([self.pairs[index] for index in self.routed_layers], dim=1)
        self.report = RoutingReport(
            layers=self.routed_layers,
            rows=layout.row.clone(),
            z=z,
            msr=1.0 - z.mean(dim=(1, 2)),
            esr_per_layer=esr,
        )

    # -- attention -----------------------------------------------------------------------------------------------

    def attention(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
    ) -> torch.Tensor:
        """Hybrid attention of one layer: [B, Hq, S_q, D] in, [B, Hq, S_q, D] out."""
        # In eval mode only: in training, a checkpointed layer is recomputed on the autograd engine's thread.
        if not module.training and threading.get_ident() != self.forward_thread:
            raise InputError(
                "another thread started a forward of this model while this one was running: one attached model "
                "serves one forward at a time; use one model (attached separately) per thread"
            )
        layout = self.layout
        # With a bounded cache, a step after the prompt receives only its own new keys; the rest is in the cache.
        bounded = layout is not None and self.cache is not None and not layout.is_prefill
        expected_keys = None if layout is None else layout.query_len if bounded else layout.kv_len
        if layout is None or key.shape[2] != expected_keys or query.shape[2] != layout.query_len:
            raise InputError(
                "elastic attention saw keys/queries that do not match this forward's inputs; "
                "was the model called through its decoder?"
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        layer_index = module.layer_idx
        if bounded:
            return self.cache.layers[layer_index].attend(query, scale)
        if not layout.is_prefill:
            return self._attend_tokens(query, key, value, layer_index, scale)
        output = self._attend_prefill(query, key, value, layer_index, scale)
        if self.cache is not None:
            self.cache.layers[layer_index].commit()
        return output

    def _attend_tokens(self, query, key, value, layer_index: int, scale: float) -> torch.Tensor:
        """A step that continues a cached past, over every cached key, by the token rule (`patterns.tokens`)."""
        num_kv, group = key.shape[1], query.shape[1] // key.shape[1]
        output = torch.zeros_like(query)
        for n, (row, start, length, first_row, count) in enumerate(self.layout.spans()):
            if count == 0:
                continue
            streaming = self.streaming_heads(layer_index, n, num_kv).to(query.device)
            attended = token_attention(
                query[row, :, first_row : first_row + count].unflatten(0, (num_kv, group)),
                key[row, :, start : start + length],
                value[row, :, start : start + length],
                torch.arange(length - count, length, device=query.device),
                torch.arange(length, device=query.device),
                streaming,
                sink_tokens=self.config.sink_tokens,
                local_tokens=self.config.local_tokens,
                scale=scale,
            )
            output[row, :, first_row : first_row + count] = attended.flatten(0, 1)
        return output

    def _attend_prefill(self, query, key, value, layer_index: int, scale: float) -> torch.Tensor:
        layout = self.layout
        z = self.decisions.get(layer_index)
        if z is None:
            modes = torch.full((layout.num_sequences, key.shape[1]), FULL, dtype=torch.long, device=query.device)
            return self._attend(query, key, value, modes, scale, layer_index)
        retrieval = MODE_CODES[self.config.retrieval_mode]
        sparse = MODE_CODES[self.config.sparse_mode]
        chosen = torch.where(is_retrieval(z), retrieval, sparse).long()
        if not (z.requires_grad and torch.is_grad_enabled()):
            return self._attend(query, key, value, chosen, scale, layer_index)
        # Training: every head computes both outputs; the straight-through z mixes them and carries the gradient.
        tables_retrieval, pairs_retrieval = self._tables(torch.full_like(chosen, retrieval), query, key, scale)
        tables_sparse, pairs_sparse = self._tables(torch.full_like(chosen, sparse), query, key, scale)
        group = query.shape[1] // key.shape[1]
        retrieval_heads = (chosen == retrieval).repeat_interleave(group, dim=1).to(pairs_retrieval.device)
        self._record_sparsity(layer_index, torch.where(retrieval_heads, pairs_retrieval, pairs_sparse))
        out_retrieval = self.backend.attend(query, key, value, layout, tables_retrieval, scale)
        out_sparse = self.backend.attend(query, key, value, layout, tables_sparse, scale)
        weight = self._per_row_weight(z, query)
        return weight * out_retrieval + (1.0 - weight) * out_sparse

    def _tables(self, modes: torch.Tensor, query: torch.Tensor, key: torch.Tensor, scale: float):
        """(block tables, attended pairs per head) of one layer; the forward's patterns are built once."""
        if self._builder is None or self._builder.layout is not self.layout:
            self._builder = BlockTableBuilder(self.layout, self.config, query.device)
        return self._builder.build(modes, query.shape[1], query=query, key=key, scale=scale)

    def _attend(self, query, key, value, modes, scale, layer_index: int) -> torch.Tensor:
        tables, pairs = self._tables(modes, query, key, scale)
        self._record_sparsity(layer_index, pairs)
        return self.backend.attend(query, key, value, self.layout, tables, scale)

    def _record_sparsity(self, layer_index: int, attended: torch.Tensor) -> None:
        """ESR of a layer per sequence from attended causal pairs per head [N, Hq]."""
        if self._causal_pairs is None or self._causal_pairs[0] is not self.layout:
            self._causal_pairs = (self.layout, causal_pairs(self.layout).to(attended.device).double())
        sparsity = 1.0 - attended.double() / self._causal_pairs[1][:, None]
        self.pairs[layer_index] = sparsity.mean(dim=1).float()

    def _per_row_weight(self, z: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """[N, Hkv] decisions spread to [B, Hq, S_q, 1] over each sequence's query rows."""
        batch, num_query_heads, query_len, _ = query.shape
        group = num_query_heads // z.shape[1]
        per_head = z.repeat_interleave(group, dim=1).to(query.dtype)
        weight = query.new_zeros(batch, num_query_heads, query_len, 1)
        for n, (row, _, _, first_row, count) in enumerate(self.layout.spans()):
            weight[row, :, first_row : first_row + count] = per_head[n][:, None, None]
        return weight


def elastic_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function registered with transformers' AttentionInterface under ``"elastic_attention"``.

    Padding reaches elastic attention through the decoder pre-hook (the 2D mask), not through ``attention_mask``.

    Returns:
        ([B, S_q, Hq, D], None).
    """
    runtime: ElasticRuntime | None = getattr(module, RUNTIME_ATTRIBUTE, None)
    if runtime is None:
        raise InputError(
            f"attention implementation {ATTENTION_NAME!r} is set on a model that is not attached; "
            "call elastic_attention.attach(model, config)"
        )
    if dropout and module.training:
        raise InputError(
            f"attention dropout ({dropout}) is not supported by elastic attention; set config.attention_dropout=0"
        )
    if module.layer_idx in runtime.sliding_layers:  # the model's own attention, with the model's mask and cache
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise InputError(f"sliding-window attention (window {sliding_window}) reached a full-attention layer")
    output = runtime.attention(module, query, key, value, scaling)
    return output.transpose(1, 2).contiguous(), None

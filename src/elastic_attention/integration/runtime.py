"""`ElasticRuntime`: the per-model state of elastic attention, and the hooks that drive it.

The model's forward is untouched. Hooks and the registered attention function (`attention_function`) do the work:
- before the decoder runs (`before_decoder`): read the padding mask / packing and the cache, decide prefill or
  decode, and give eval-mode caching forwards an `ElasticCache`;
- after each routed layer's key source (k_proj or k_norm, `after_key_source`): at prefill, pool the pre-RoPE keys
  and route (`routing.ModelRouting`), and hand the cache the layer's streaming heads;
- each layer's attention (`attention`, called by the registered function): at prefill, attention from the routing
  (`hybrid_attention.HybridAttention`); after the prompt, through the bounded cache, or over Hugging Face's cache
  by the token rule;
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

from elastic_attention.backends import AttentionBackend
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import InputError
from elastic_attention.integration.families import FamilySpec
from elastic_attention.integration.hybrid_attention import HybridAttention
from elastic_attention.integration.report import RoutingReport
from elastic_attention.integration.routing import ModelRouting
from elastic_attention.patterns import SequenceLayout
from elastic_attention.router import AttentionRouter

logger = logging.getLogger(__name__)

#: Forward keyword arguments of per-call facts (see `ElasticRuntime`).
PROMPT_LENGTHS_KWARG = "elastic_prompt_lengths"
NOISE_SEED_KWARG = "elastic_noise_seed"
STATIC_STEP_KWARG = "elastic_static_step"


class ElasticRuntime:
    """The state of elastic attention for one attached model: its routing (`ModelRouting`), its attention from
    that routing (`HybridAttention`), the running forward (layout, cache) and what attach changed.

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
        sliding_layers: indices of those layers: they run the model's own attention (with the model's mask) and
            keep the model's own cache entries.
        softcap: the model's attention-logit soft-cap (Gemma 2's ``attn_logit_softcapping``), None for none; every
            attention path applies it.
        has_sinks: whether the model's attention layers have learned attention sinks (gpt-oss); each call brings its
            layer's sink logits.
        model_window: the model's sliding window on every layer (Mistral 7B v0.1: 4096 tokens), None for none. It is
            composed with the routing: a full-attention head attends the window, an SSA head its sink and local
            window inside it (`patterns.block_tables`, `patterns.tokens`).

    Per-forward facts travel as keyword arguments of the model's forward (the decoder's pre-hook takes them out):

    - ``elastic_prompt_lengths`` (`PROMPT_LENGTHS_KWARG`): for a prefill whose sequences carry more than their
      prompt (a training pack: prompt, then answer), each sequence's prompt length in tokens; the routers then pool
      the prompt only, as they do at inference, and never see the answer.
    - ``elastic_noise_seed`` (`NOISE_SEED_KWARG`): the seed of this forward's Gumbel noise (train mode); without it
      the noise comes from torch's global generator.
    - ``elastic_static_step`` (`STATIC_STEP_KWARG`): True for a decode step over an `ElasticCache` in static mode
      (`decode_graph` passes it while it captures a step); any other forward over a static cache ends static mode.
    """

    def __init__(
        self,
        config: ElasticConfig,
        family: FamilySpec,
        backend: AttentionBackend,
        routers: dict[int, AttentionRouter],
        routed_layers: tuple[int, ...],
        num_kv_heads: int,
        head_dim: int,
        num_layers: int,
        cache_kind: str = "bounded",
        sliding_window: int | None = None,
        sliding_layers: frozenset[int] = frozenset(),
        softcap: float | None = None,
        has_sinks: bool = False,
        model_window: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        self.config = config
        self.cuda_graphs = cuda_graphs
        self.num_layers = num_layers
        self.cache_kind = cache_kind
        self.sliding_window = sliding_window
        self.sliding_layers = sliding_layers
        self.family = family
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.routing = ModelRouting(config, routers, routed_layers, num_kv_heads)
        self.softcap = softcap
        self.has_sinks = has_sinks
        self.model_window = model_window
        self.hybrid = HybridAttention(config, backend, softcap, model_window)
        #: The `ElasticCache` of the running forward (None without one).
        self.cache = None
        #: The sequences of the running forward.
        self.layout: SequenceLayout | None = None
        self.report: RoutingReport | None = None
        self._decoder_parameters: list[str] | None = None
        # What attach changed, so that detach can restore it.
        self.previous_implementation: str | None = None
        self.requires_grad_before: dict[str, bool] = {}
        self.handles: list = []
        self._warned_train_mode_caching = False
        #: The thread whose forward the runtime's state belongs to (set by `before_decoder`).
        self.forward_thread: int | None = None

    @property
    def routers(self) -> dict[int, AttentionRouter]:
        return self.routing.routers

    @property
    def routed_layers(self) -> tuple[int, ...]:
        return self.routing.routed_layers

    @property
    def decisions(self) -> dict[int, torch.Tensor]:
        """Layer index -> [N, Hkv] decisions of the last prefill (see `ModelRouting`)."""
        return self.routing.decisions

    @property
    def forced(self) -> torch.Tensor | None:
        """None, or the [routed layers, Hkv] bool routing every prefill uses instead of the routers'."""
        return self.routing.forced

    @forced.setter
    def forced(self, routing: torch.Tensor | None) -> None:
        self.routing.forced = routing

    @property
    def backend(self) -> AttentionBackend:
        return self.hybrid.backend

    def select_sequences(self, index: torch.Tensor) -> None:
        """Keep the routing of the sequences at ``index`` ([N'] int64, repeats allowed), in that order (what a
        reordered, repeated or trimmed cache needs for its later decode steps)."""
        self.routing.select_sequences(index)

    # -- hooks ---------------------------------------------------------------------------------------------------

    def before_decoder(self, decoder: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Forward pre-hook of the decoder: derive the sequence layout and whether this is a prefill; at a prefill
        in eval mode with ``cache_kind="bounded"``, give the forward an `ElasticCache` in place of an empty one."""
        if self._decoder_parameters is None:
            self._decoder_parameters = list(inspect.signature(decoder.forward).parameters)
        passed = any(name in kwargs for name in (PROMPT_LENGTHS_KWARG, NOISE_SEED_KWARG, STATIC_STEP_KWARG))
        prompt_lengths, noise_seed = kwargs.pop(PROMPT_LENGTHS_KWARG, None), kwargs.pop(NOISE_SEED_KWARG, None)
        static_step = bool(kwargs.pop(STATIC_STEP_KWARG, False))
        bound = {**dict(zip(self._decoder_parameters, args)), **kwargs}
        inputs = bound.get("input_ids")
        if inputs is None:
            inputs = bound.get("inputs_embeds")
        if inputs is None:
            raise InputError("elastic attention needs input_ids or inputs_embeds")
        batch_size, query_len = inputs.shape[0], inputs.shape[1]
        cache = bound.get("past_key_values", bound.get("cache"))
        self._check_static(cache, static_step)
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
            self.routing.check_decode(layout)
        else:
            # Kept for the whole forward and its backward (a recomputed layer pools the same tokens and draws the
            # same noise).
            self.routing.begin_prefill(prompt_lengths, noise_seed)
            self.hybrid.begin_prefill()
        self.layout = layout
        if self.cache is not None:
            self.cache.begin_forward(layout)
        self.forward_thread = threading.get_ident()
        return (args, kwargs) if replaced or passed else None

    @staticmethod
    def _check_static(cache, static_step: bool) -> None:
        """A static decode step needs a static cache; any other forward over a static cache ends its static mode."""
        static = getattr(cache, "static_capacity", None) is not None
        if static_step and not static:
            raise InputError(f"{STATIC_STEP_KWARG}=True needs an ElasticCache in static mode (begin_static)")
        if static and not static_step:
            cache.end_static()

    def _choose_cache(self, decoder: nn.Module, bound: dict, cache, past: int, kwargs: dict) -> bool:
        """Set ``self.cache`` for this forward; returns True when ``kwargs`` now carries a new cache (an `ElasticCache`,
        or for ``cache="full"`` on a model with a window on every layer, one that keeps every key)."""
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
        if decoder.training or not use_cache or past != 0:
            return False
        if self.cache_kind != "bounded" and self.model_window is None:
            return False
        # transformers renamed the decoder's `past_key_values` argument to `cache`; use whichever the call uses.
        names = [name for name in ("cache", "past_key_values") if name in kwargs]
        if not names:
            if cache is not None:
                return False
            names = ["cache" if "cache" in self._decoder_parameters else "past_key_values"]
        if self.cache_kind == "bounded":
            self.cache = ElasticCache(self)
            kwargs[names[0]] = self.cache
        else:
            # ``cache="full"`` on a model with a window on every layer: Hugging Face's cache for it keeps only the
            # window, while the token-rule attention over a cached past reads the keys at their positions from 0.
            from transformers.cache_utils import DynamicCache

            kwargs[names[0]] = DynamicCache()
        return True

    def after_key_source(self, layer_index: int, output: torch.Tensor) -> None:
        """Forward hook of a routed layer's key source: route at prefill, and tell the cache which heads stream."""
        layout = self.layout
        if layout is None or not layout.is_prefill:
            return
        layout_of_keys = self.family.key_layout
        if layout_of_keys == "flat":
            keys = output.unflatten(-1, (-1, self.head_dim))
        else:
            keys = output.transpose(1, 2) if layout_of_keys == "heads_tokens" else output
        z = self.routing.route(layer_index, keys, layout)
        if z is not None and self.cache is not None:  # None: routed in `attention`, from its queries and keys
            self.cache.route_layer(layer_index, self.routing.streaming(z))

    def after_decoder(self, decoder: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """Forward hook of the decoder: publish the routing report of a prefill; let go of this forward's cache (the
        caller holds it, through the model's output)."""
        self.cache = None
        layout = self.layout
        if layout is None or not layout.is_prefill or not self.decisions:
            return
        self.report = self.routing.report(layout, self.hybrid.sparsity)
        if not decoder.training:
            warn_if_window_covers(self.config, layout, self.report)

    # -- attention -----------------------------------------------------------------------------------------------

    def attention(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hybrid attention of one layer: [B, Hq, S_q, D] in, [B, Hq, S_q, D] out (``sinks``: [Hq] the layer's
        attention-sink logits, for a model with sinks)."""
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
            return self.cache.layers[layer_index].attend(query, scale, sinks)
        if not layout.is_prefill:
            return self.hybrid.continue_tokens(
                query, key, value, layout, lambda n: self.routing.streaming_heads(layer_index, n), scale, sinks
            )
        if self.routing.routes_in_attention(layer_index):
            z = self.routing.route_signal(layer_index, query, key, layout, scale)
            if self.cache is not None:
                self.cache.route_layer(layer_index, self.routing.streaming(z))
        output = self.hybrid.prefill(query, key, value, layout, self.decisions.get(layer_index), layer_index, scale,
                                     sinks)
        if self.cache is not None:
            self.cache.layers[layer_index].commit()
        return output


def warn_if_window_covers(config, layout: SequenceLayout, report: RoutingReport) -> None:
    """Log one warning for a prefill whose prompts (some of them) fit in the SSA window while their routing sends
    heads to SSA: such a head attends every token, so nothing is skipped whatever the MSR (`try` and `generate` print
    the same, `evaluation.showcase.window_note`). The record carries ``window_note=True`` for them to drop it."""
    if config.sparse_mode != "ssa":
        return
    window = config.sink_tokens + config.local_tokens
    covered = [length for length, msr in zip(layout.key_len.tolist(), report.msr.detach().tolist())
               if length <= window and msr > 0]
    if covered:
        logger.warning(
            "elastic attention: %d of %d prompts (%d tokens at most) fit in the sparse window (sink %d + local %d "
            "tokens): a head on SSA skips nothing there, whatever the MSR", len(covered), layout.num_sequences,
            max(covered), config.sink_tokens, config.local_tokens, extra={"window_note": True})


"""The authors' checkpoint layout (LCM-Lab/Elastic-Attention): their config fields and router tensor names.

Their checkpoints are a base model folder (``model_type`` of the base, e.g. ``qwen3``; ``architectures``
``PawQwen3ForCausalLM``) whose config carries extra fields and whose safetensors carry the routers beside the base
weights. What their evaluation does with them, as read from their code:

- ``retrieval_mode`` (``full`` / ``xattn``) is the mode of heads routed to class 1, ``toggle_type`` (``streaming`` /
  ``xattn``) the mode of the others: full + streaming is our ``fa-ssa``, full + xattn ``fa-xa``, xattn + streaming
  ``xa-ssa``.
- Streaming keeps ``ceil(sink_size / 128)`` sink blocks and ``ceil(local_window_size / 128)`` local blocks of 128
  tokens (``block_size``, 128 by default); XAttention uses stride 16 and threshold 0.8.
- The router (``use_softmax: true``: two logits, argmax, class 1 = full attention) pools each KV head's keys after
  the k-norm and before RoPE over the first 100 and the last 100 prompt tokens (``pooling_mode: ctx_q``).
- Per layer: ``model.layers.{i}.self_attn.mask_allocator.cls_feat_extractor.{0,2}.*`` (our task MLP) and
  ``...cls_router_head_agnostic.{0,2,4}.*`` (our router MLP); ``attn_mask_log_alphas`` (a static per-head mask used
  only when ``enable_ada_sparsity`` is false), ``log_temp`` and the model-level ``sparsity_lambda*`` multipliers are
  not needed for inference.

Two differences are deliberate: their evaluation routes every sample of a batch like the first and pools
overlapping slices for prompts under 200 tokens; here each sample is routed from its own prompt, and a prompt of
at most ``pool_first + pool_last`` tokens is pooled whole.
"""

from __future__ import annotations

import math
import re
from typing import Any

from elastic_attention.config import ElasticConfig
from elastic_attention.errors import ConfigError

#: Their router tensors: model.layers.{i}.self_attn.mask_allocator.<part>.<index>.<param>
ROUTER_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.self_attn\.mask_allocator\.(cls_feat_extractor|cls_router_head_agnostic)\.(\d+)\."
    r"(weight|bias)$"
)
#: Their tensors that inference does not need (named in one log line when loading).
UNUSED_KEY = re.compile(r"(\.mask_allocator\.|attn_mask_log_alphas|(?:^|\.)sparsity_lambda)")
#: Their router parts -> ours.
PARTS = {"cls_feat_extractor": "task_mlp", "cls_router_head_agnostic": "router_mlp"}
#: Fields that mark a config as theirs.
MARKER_FIELDS = ("toggle_type", "retrieval_mode", "local_window_size", "sink_size")
#: Their fixed evaluation settings.
BLOCK_SIZE, XA_STRIDE, XA_THRESHOLD, POOL_TOKENS = 128, 16, 0.8, 100
#: Their fields that only shape training or the static-mask path; inference here does not read them.
TRAINING_FIELDS = frozenset({
    "disable_linear_regularization_term", "suggested_sparsity", "suggested_threshold", "enable_lambda_task",
    "enable_layerwise_sparsity", "layerwise_sparsity_schedule", "layerwise_sparsity_min_ratio",
    "layerwise_sparsity_max_ratio", "layerwise_sparsity_power", "layerwise_sparsity_weight", "erank_analysis_path",
    "topk_k", "pooling_seq", "triangle_n_last", "mask_temp", "mask_hard_sample", "enable_contrastive_loss",
})
_CONFIGURATIONS = {("full", "streaming"): "fa-ssa", ("full", "xattn"): "fa-xa", ("xattn", "streaming"): "xa-ssa"}
_ARCHITECTURES = {"qwen3": "PawQwen3ForCausalLM", "llama": "PawLlamaForCausalLM"}


def is_reference_config(fields: dict[str, Any]) -> bool:
    """Whether a model's config.json is in the authors' layout."""
    architectures = fields.get("architectures") or []
    return any(name in fields for name in MARKER_FIELDS) or any(str(a).startswith("Paw") for a in architectures)


def elastic_config_from_reference(
    fields: dict[str, Any], *, router_width: int, routed_layers: tuple[int, ...] | None
) -> ElasticConfig:
    """The `ElasticConfig` that runs their routers as their evaluation does.

    Raises:
        ConfigError: a field or value that cannot be honoured here (named): an unknown mode, every head on XA, a
            sigmoid router head, task embeddings, static masks instead of routers, another pooling mode.
    """
    retrieval, toggle = fields.get("retrieval_mode", "full"), fields.get("toggle_type", "streaming")
    if (retrieval, toggle) not in _CONFIGURATIONS:
        raise ConfigError(
            f"retrieval_mode {retrieval!r} with toggle_type {toggle!r} is not supported; supported pairs: "
            f"{sorted(_CONFIGURATIONS)}"
        )
    pooling = fields.get("pooling_mode", "first_token")
    refusals = [
        (fields.get("use_softmax", False) is not True,
         "a one-logit sigmoid router head (use_softmax: false) is not supported; only the two-logit softmax head is"),
        (bool(fields.get("use_task_emb_for_mask", False)),
         "task embeddings in the routing (use_task_emb_for_mask: true) are not supported"),
        (fields.get("enable_ada_sparsity", False) is not True,
         "enable_ada_sparsity: false means static per-head masks (attn_mask_log_alphas), not routers; load the "
         "folder as a plain model"),
        (pooling != "ctx_q",
         f"pooling_mode {pooling!r} is not supported; their evaluation and this library pool the first and last 100 "
         "prompt tokens (ctx_q)"),
    ]
    for problem, message in refusals:
        if problem:
            raise ConfigError(message)
    block = int(fields.get("block_size", BLOCK_SIZE))
    sink = math.ceil(int(fields.get("sink_size", 128)) / block) * block
    local = max(block, math.ceil(int(fields.get("local_window_size", 1024)) / block) * block)
    return ElasticConfig(
        configuration=_CONFIGURATIONS[(retrieval, toggle)], block_size=block, sink_tokens=sink, local_tokens=local,
        xa_stride=XA_STRIDE, xa_threshold=XA_THRESHOLD, pool_first=POOL_TOKENS, pool_last=POOL_TOKENS,
        router_width=router_width, routed_layers=routed_layers,
    )


def reference_fields(config: ElasticConfig, model_type: str) -> dict[str, Any]:
    """Their config fields (and architecture) for a model attached with ``config``.

    Raises:
        ConfigError: a setting their evaluation would not reproduce (named): standardized router inputs, a head-set
            router, pooling other than 100 + 100 tokens, blocks other than 128, XA settings other than stride 16 and
            threshold 0.8 where XA heads run, a subset of routed layers, a family without their model class.
    """
    problems = []
    if config.router_standardize:
        problems.append("router_standardize: true (their router has no input standardization)")
    if config.head_set_choices:
        problems.append(f"head_set_choices {config.head_set_choices} (their routers decide each KV head)")
    if (config.pool_first, config.pool_last) != (POOL_TOKENS, POOL_TOKENS):
        problems.append(f"pool_first/pool_last {config.pool_first}/{config.pool_last} (theirs: 100/100)")
    if config.block_size != BLOCK_SIZE:
        problems.append(f"block_size {config.block_size} (theirs: 128)")
    if "xa" in (config.retrieval_mode, config.sparse_mode) and (config.xa_stride, config.xa_threshold) != (
            XA_STRIDE, XA_THRESHOLD):
        problems.append(f"xa_stride/xa_threshold {config.xa_stride}/{config.xa_threshold} (theirs: 16/0.8)")
    if config.routed_layers is not None:
        problems.append(f"routed_layers {list(config.routed_layers)} (theirs route every layer)")
    if model_type not in _ARCHITECTURES:
        problems.append(f"model_type {model_type!r} (their layout exists for {sorted(_ARCHITECTURES)})")
    if problems:
        raise ConfigError("cannot write the authors' layout: " + "; ".join(problems))
    retrieval, toggle = next(pair for pair, name in _CONFIGURATIONS.items() if name == config.configuration)
    return {
        "architectures": [_ARCHITECTURES[model_type]],
        "retrieval_mode": retrieval,
        "toggle_type": toggle,
        "sink_size": config.sink_tokens,
        "local_window_size": config.local_tokens,
        "block_size": config.block_size,
        "pooling_mode": "ctx_q",
        "use_softmax": True,
        "enable_ada_sparsity": True,
        "use_task_emb_for_mask": False,
    }


def reference_name(layer: int, name: str) -> str:
    """Their tensor name for our router tensor ``name`` (``task_mlp.0.weight``) of decoder layer ``layer``."""
    part, rest = name.split(".", 1)
    theirs = {ours: their for their, ours in PARTS.items()}[part]
    return f"model.layers.{layer}.self_attn.mask_allocator.{theirs}.{rest}"

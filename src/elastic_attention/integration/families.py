"""Model families elastic attention serves, as data: where the layers, attention modules and key states live.

A family needs no copied model code: its attention module must dispatch through transformers' AttentionInterface,
and one of its submodules must output the layer's key states before RoPE. The model's own layer types decide what
is routed (`layer_kinds`): full-attention layers get routers; sliding-window layers keep the model's attention and
its cache entries, unchanged. A model without layer types that slides one window on every layer (Mistral 7B v0.1)
has every layer routed, its window composed with the routing (`model_window`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from elastic_attention.errors import UnsupportedModelError


@dataclass(frozen=True)
class FamilySpec:
    """Where a family keeps what the router needs.

    Attributes:
        layers: attribute path from the decoder (the module with the embedding and the layer list) to the layers.
        attention: attribute of a decoder layer holding its attention module.
        key_source: attribute of the attention module whose output is the pre-RoPE key states.
        key_layout: the key source's output: ``"flat"`` [B, S, Hkv * D], ``"tokens_heads"`` [B, S, Hkv, D] or
            ``"heads_tokens"`` [B, Hkv, S, D].
        attention_sinks: the attention modules pass learned per-head sink logits (``s_aux``) with every call.
    """

    layers: str = "layers"
    attention: str = "self_attn"
    key_source: str = "k_proj"
    key_layout: str = "flat"
    attention_sinks: bool = False


#: model_type -> family. Qwen3 and Gemma 3 normalize keys per head (k_norm) before RoPE; the router reads the
#: normalized keys (Qwen3 before moving the heads first, Gemma 3 after).
FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(),
    "mistral": FamilySpec(),
    "qwen2": FamilySpec(),
    "qwen3": FamilySpec(key_source="k_norm", key_layout="tokens_heads"),
    "gemma2": FamilySpec(),
    "gemma3_text": FamilySpec(key_source="k_norm", key_layout="heads_tokens"),
    "cohere2": FamilySpec(),
    "gpt_oss": FamilySpec(attention_sinks=True),
}

#: The model's layer types, as this package names them.
_LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}


def family_of(model: nn.Module) -> tuple[str, FamilySpec]:
    """The family of a Hugging Face model, or a refusal that says which families are supported."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by elastic attention; supported: {sorted(FAMILIES)}. "
            "A new family is one entry in elastic_attention.integration.families.FAMILIES"
        )
    layer_kinds(model)
    return model_type, FAMILIES[model_type]


def layer_kinds(model: nn.Module) -> list[str]:
    """``"full"`` or ``"sliding"`` for every decoder layer, from the model's config.

    A model without layer types that applies a sliding window on every layer counts as full attention on every
    layer: its window is composed with the routing (`model_window`).

    Raises:
        UnsupportedModelError: a layer type other than full or sliding-window attention (named), or only
            sliding-window layers.
    """
    config = model.config
    count = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        unknown = sorted({kind for kind in layer_types if kind not in _LAYER_KINDS})
        if unknown:
            raise UnsupportedModelError(
                f"layer types {unknown} are not supported; elastic attention routes full-attention layers and keeps "
                "sliding-window layers as the model runs them"
            )
        kinds = [_LAYER_KINDS[kind] for kind in layer_types]
        if "full" not in kinds:
            raise UnsupportedModelError(
                f"every layer of this model is a sliding-window layer (window {getattr(config, 'sliding_window', None)}"
                "): there is no full-attention layer to route"
            )
        return kinds
    return ["full"] * count


def model_window(model: nn.Module) -> int | None:
    """The sliding window (tokens) a model without layer types applies on every layer, or None.

    Raises:
        UnsupportedModelError: a window that is not a positive number of tokens.
    """
    config = model.config
    if getattr(config, "layer_types", None):
        return None
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UnsupportedModelError(f"sliding_window must be a positive number of tokens, got {window!r}")
    return window


def decoder_of(model: nn.Module, family: FamilySpec) -> nn.Module:
    """The module that owns the decoder layers (``model.model`` for a causal LM, or the base model itself)."""
    for candidate in (getattr(model, "model", None), model):
        if candidate is not None and _resolve(candidate, family.layers) is not None:
            return candidate
    raise UnsupportedModelError(
        f"{type(model).__name__} has no decoder layers at `.{family.layers}` or `.model.{family.layers}`"
    )


def decoder_layers(decoder: nn.Module, family: FamilySpec) -> list[nn.Module]:
    """The decoder layers, in order."""
    return list(_resolve(decoder, family.layers))


def attention_modules(decoder: nn.Module, family: FamilySpec) -> list[nn.Module]:
    """Attention module of every decoder layer, in layer order."""
    modules = []
    for index, layer in enumerate(decoder_layers(decoder, family)):
        attention = getattr(layer, family.attention, None)
        if attention is None or getattr(attention, family.key_source, None) is None:
            raise UnsupportedModelError(
                f"decoder layer {index} has no `{family.attention}.{family.key_source}`; "
                "the family table does not match this model"
            )
        modules.append(attention)
    return modules


def _resolve(module: nn.Module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module

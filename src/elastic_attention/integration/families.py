"""Model families elastic attention serves, as data: where the layers, attention modules and key states live.

A family needs no copied model code: its attention module must dispatch through transformers' AttentionInterface,
and one of its submodules must output the layer's key states before RoPE.
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
        key_source_has_heads: the key source outputs [B, S, Hkv, D] (True) or [B, S, Hkv * D] (False).
    """

    layers: str = "layers"
    attention: str = "self_attn"
    key_source: str = "k_proj"
    key_source_has_heads: bool = False


#: model_type -> family. Qwen3 normalizes keys per head (k_norm) before RoPE; the router reads the normalized keys.
FAMILIES: dict[str, FamilySpec] = {
    "llama": FamilySpec(),
    "mistral": FamilySpec(),
    "qwen2": FamilySpec(),
    "qwen3": FamilySpec(key_source="k_norm", key_source_has_heads=True),
}


def family_of(model: nn.Module) -> tuple[str, FamilySpec]:
    """The family of a Hugging Face model, or a refusal that says which families are supported."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by elastic attention; supported: {sorted(FAMILIES)}. "
            "A new family is one entry in elastic_attention.integration.families.FAMILIES"
        )
    _refuse_sliding_windows(config)
    return model_type, FAMILIES[model_type]


def decoder_of(model: nn.Module, family: FamilySpec) -> nn.Module:
    """The module that owns the decoder layers (``model.model`` for a causal LM, or the base model itself)."""
    for candidate in (getattr(model, "model", None), model):
        if candidate is not None and _resolve(candidate, family.layers) is not None:
            return candidate
    raise UnsupportedModelError(
        f"{type(model).__name__} has no decoder layers at `.{family.layers}` or `.model.{family.layers}`"
    )


def attention_modules(decoder: nn.Module, family: FamilySpec) -> list[nn.Module]:
    """Attention module of every decoder layer, in layer order."""
    modules = []
    for index, layer in enumerate(_resolve(decoder, family.layers)):
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


def _refuse_sliding_windows(config) -> None:
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({kind for kind in layer_types if kind != "full_attention"})
    window = getattr(config, "sliding_window", None)
    window_used = window is not None and getattr(config, "use_sliding_window", True)
    if other or window_used:
        raise UnsupportedModelError(
            f"this model uses sliding-window or other non-full attention layers (layer types {other or 'n/a'}, "
            f"sliding_window={window}); elastic attention routes full-attention layers only. If the checkpoint "
            "was trained without a window, load it with sliding_window=None"
        )

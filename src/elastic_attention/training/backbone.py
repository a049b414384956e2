"""The pretrained backbone as a Hugging Face model: a Qwen3 config from a shape, the fresh model, its saved folder.

Qwen3 with rope_theta 1e6 (written as ``rope_parameters`` where the config has it, else as ``rope_theta``; checked
again on the reloaded ``config.json``), tied embeddings, a vocabulary of 1024 (the synthetic suite has about 915
words), SDPA attention. The saved folder loads offline with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``. ``transformers`` is imported inside the functions that need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from elastic_attention.io import atomic_folder
from elastic_attention.training.pretrain_config import BackboneShape

ROPE_THETA = 1e6
MODEL_VOCAB_SIZE = 1024


def rope_theta_of(config: Any) -> float | None:
    """The RoPE base of a config, wherever this transformers version keeps it."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return None if theta is None else float(theta)


def build_backbone_config(shape: BackboneShape, tokenizer: Any, max_len: int) -> Any:
    """A ``Qwen3Config`` of ``shape`` with rope_theta 1e6, tied embeddings and the tokenizer's special ids;
    ``max_position_embeddings`` is ``max(131072, max_len)``."""
    from transformers import Qwen3Config

    common = dict(
        vocab_size=MODEL_VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=max(131072, max_len),
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    try:
        config = Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    except TypeError:  # transformers without rope_parameters
        config = Qwen3Config(**common, rope_theta=ROPE_THETA)
    if rope_theta_of(config) != ROPE_THETA:
        config = Qwen3Config(**common, rope_theta=ROPE_THETA)
    if rope_theta_of(config) != ROPE_THETA:
        raise RuntimeError(f"could not set rope_theta {ROPE_THETA} on Qwen3Config; got {rope_theta_of(config)}")
    return config


def build_backbone(config: Any, device: torch.device, qk_norm_init: float = 1.0, seed: int = 0) -> torch.nn.Module:
    """A fresh ``Qwen3ForCausalLM`` from ``config`` (initialised from ``seed``) with SDPA attention, float32 weights
    on ``device``, the query and key RMSNorm weights at ``qk_norm_init`` and a greedy generation config."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                parameter.fill_(qk_norm_init)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    return model.to(device=device, dtype=torch.float32)


def save_backbone(model: torch.nn.Module, tokenizer: Any, folder: Path, staging_prefix: str) -> dict[str, Any]:
    """Cast ``model`` to bf16 (in place: what is evaluated next is what was saved) and publish it with the tokenizer
    as ``folder`` (written under ``staging_prefix`` beside it, then renamed); check rope_theta on the reloaded config.

    Returns:
        ``{"rope_theta_reloaded": float, "weights_bytes": int}``.
    """
    from transformers import AutoConfig

    with atomic_folder(folder, staging_prefix) as staging:
        model.to(torch.bfloat16).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    theta = rope_theta_of(AutoConfig.from_pretrained(folder))
    if theta != ROPE_THETA:
        raise RuntimeError(f"saved config carries rope_theta {theta}, expected {ROPE_THETA}")
    weights = sum(path.stat().st_size for path in folder.glob("*.safetensors"))
    return {"rope_theta_reloaded": theta, "weights_bytes": weights}

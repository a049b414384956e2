"""The weights of a GGUF file as a Hugging Face state dict, dequantized in torch (`models.convert_gguf` writes them).

transformers' own GGUF loader dequantizes with the `gguf` package's numpy code and then builds the model twice; for
the 1.5B model that took about 100 s on a 2-core CPU, most of it outside the arithmetic. Here each tensor is read from
the file's memory map, dequantized by vectorized torch code that follows the `gguf` package's (and ggml's) formulas
operation for operation in float32, so the result is bit for bit the same, and renamed to the Hugging Face name.

Types: F32, F16, BF16 and the k-quants Q4_K and Q6_K (what the Q4_K_M files of `models.KNOWN_MODELS` hold); names:
the Qwen2 layout (``blk.N.attn_q.weight`` -> ``model.layers.N.self_attn.q_proj.weight``, ...). Other architectures
are refused: Llama's, for one, stores its query and key rows permuted for ggml's rotary embedding, which this module
does not undo. On the 1.5B file (2026-12-05, this 2-core AMD EPYC) every tensor came out equal to transformers'
conversion, and `models.convert_gguf` wrote the same bytes in 58 s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from elastic_attention.errors import InputError

#: Values per k-quant super-block.
QK_K = 256
#: Bytes per super-block: Q4_K (d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit quants) and Q6_K
#: (128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d).
Q4_K_BLOCK_BYTES = 2 + 2 + 12 + QK_K // 2
Q6_K_BLOCK_BYTES = QK_K // 2 + QK_K // 4 + QK_K // 16 + 2

#: Architectures whose files this module reads (``general.architecture``).
ARCHITECTURES = ("qwen2",)

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_MODEL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(.+)")


def dequantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 144] Q4_K super-blocks -> float32 [N, 256]: value ``(d * scale_j) * q - dmin * min_j`` for the 32
    4-bit quants q of sub-block j (8 sub-blocks, 6-bit scales and mins)."""
    count = _check_blocks(blocks, Q4_K_BLOCK_BYTES, "Q4_K")
    d = _halves(blocks[:, 0:2])
    dmin = _halves(blocks[:, 2:4])
    scales, mins = _scales_and_mins_k4(blocks[:, 4:16])
    d = (d * scales.float()).view(count, 8, 1)
    dm = (dmin * mins.float()).view(count, 8, 1)
    quants = blocks[:, 16:].reshape(count, 4, 1, 32) >> _shifts(blocks, (0, 4)).view(1, 1, 2, 1)
    quants = (quants & 0x0F).reshape(count, 8, 32).float()
    return (d * quants - dm).reshape(count, QK_K)


def dequantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 210] Q6_K super-blocks -> float32 [N, 256]: value ``(d * scale_j) * (q - 32)`` for the 16 6-bit
    quants q of sub-block j (16 sub-blocks, int8 scales)."""
    count = _check_blocks(blocks, Q6_K_BLOCK_BYTES, "Q6_K")
    low, high = blocks[:, : QK_K // 2], blocks[:, QK_K // 2 : QK_K // 2 + QK_K // 4]
    scales = blocks[:, QK_K // 2 + QK_K // 4 : -2].contiguous().view(torch.int8).float()
    d = (_halves(blocks[:, -2:]) * scales).view(count, QK_K // 16, 1)
    low = low.reshape(count, 2, 1, 64) >> _shifts(blocks, (0, 4)).view(1, 1, 2, 1)
    low = (low & 0x0F).reshape(count, 8, 32)
    high = high.reshape(count, 2, 1, 32) >> _shifts(blocks, (0, 2, 4, 6)).view(1, 1, 4, 1)
    high = (high & 0x03).reshape(count, 8, 32)
    quants = (low | (high << 4)).float() - 32
    return (d * quants.view(count, QK_K // 16, 16)).reshape(count, QK_K)


def _check_blocks(blocks: torch.Tensor, block_bytes: int, name: str) -> int:
    if blocks.dtype != torch.uint8 or blocks.ndim != 2 or blocks.shape[1] != block_bytes:
        raise InputError(f"{name} data must be uint8 [blocks, {block_bytes}], got {blocks.dtype} {list(blocks.shape)}")
    return blocks.shape[0]


def _halves(pairs: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 2] little-endian float16 values -> float32 [N, 1]."""
    return pairs.contiguous().view(torch.float16).float()


def _shifts(like: torch.Tensor, amounts: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(amounts, dtype=torch.uint8, device=like.device)


def _scales_and_mins_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [N, 12] packed 6-bit scales and mins of Q4_K -> (scales [N, 8], mins [N, 8]), uint8: sub-blocks 0-3 take
    the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take the nibbles of bytes 8-11 with the top 2
    bits of bytes 0-3 (scales) and 4-7 (mins) above them."""
    low_scales, low_mins, nibbles = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low_scales & 0x3F, (nibbles & 0x0F) | ((low_scales >> 2) & 0x30)], dim=1)
    mins = torch.cat([low_mins & 0x3F, (nibbles >> 4) | ((low_mins >> 2) & 0x30)], dim=1)
    return scales, mins


def dequantize(data: torch.Tensor, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A GGUF tensor's values as float32 (or as stored, for F16 and BF16) of ``shape`` (PyTorch order: the GGUF
    dimensions reversed).

    Args:
        data: its bytes as the file holds them, uint8 (any shape; read in order).
        type_name: the GGUF type's name (``"Q4_K"``, ``"F32"``, ...).
    """
    flat = data.reshape(-1)
    if type_name in ("F32", "F16", "BF16"):
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        values = flat.view(dtype)
    elif type_name == "Q4_K":
        values = dequantize_q4_k(flat.view(-1, Q4_K_BLOCK_BYTES))
    elif type_name == "Q6_K":
        values = dequantize_q6_k(flat.view(-1, Q6_K_BLOCK_BYTES))
    else:
        raise InputError(f"GGUF type {type_name} is not one this converter dequantizes (F32, F16, BF16, Q4_K, Q6_K)")
    if values.numel() != math.prod(shape):
        raise InputError(f"a {type_name} tensor of shape {list(shape)} has {values.numel()} values in the file")
    return values.reshape(shape)


def hugging_face_name(name: str) -> str:
    """The Hugging Face parameter name of a GGUF tensor of a Qwen2 file (``blk.3.attn_q.bias`` ->
    ``model.layers.3.self_attn.q_proj.bias``)."""
    if name in _MODEL_NAMES:
        return _MODEL_NAMES[name]
    matched = _LAYER_PATTERN.fullmatch(name)
    if matched is None or matched.group(2) not in _LAYER_NAMES:
        raise InputError(f"GGUF tensor {name!r} has no Hugging Face name here (Qwen2 layouts only)")
    return f"model.layers.{matched.group(1)}.{_LAYER_NAMES[matched.group(2)]}"


def state_dict_of(path: str | Path, dtype: torch.dtype = torch.bfloat16,
                  device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF file at ``path``, dequantized and cast to ``dtype``, under its Hugging Face name, on
    the CPU (``device``: where to dequantize, e.g. ``"cuda"``; the same values, bit for bit, as float32 products and
    differences round alike everywhere).

    Raises:
        InputError: an architecture other than those of `ARCHITECTURES`, a tensor type or name this module does not
            know, or a tensor whose bytes do not fill its shape.
    """
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = reader.fields.get("general.architecture")
    architecture = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    if architecture not in ARCHITECTURES:
        raise InputError(f"{path} holds a {architecture} model; this converter reads {', '.join(ARCHITECTURES)} files "
                         "(transformers' GGUF loader reads others)")
    weights = {}
    for tensor in reader.tensors:
        data = torch.from_numpy(tensor.data.copy()).view(torch.uint8).to(device)
        shape = tuple(int(size) for size in reversed(tensor.shape.tolist()))
        weights[hugging_face_name(tensor.name)] = dequantize(data, tensor.tensor_type.name, shape).to(dtype).cpu()
    return weights


"""GGUF weights without transformers' loader: the k-quant dequantizers against a slow per-value transcription of
ggml's C loops, the Hugging Face names, a small GGUF file written by the `gguf` package read back, and a model built
from a state dict (tied and untied heads) saved and loaded again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elastic_attention import gguf_weights
from elastic_attention.errors import InputError
from elastic_attention.models import model_from_state_dict


def random_blocks(count: int, block_bytes: int, half_offsets: tuple[int, ...], seed: int) -> torch.Tensor:
    """uint8 [count, block_bytes] of random bytes whose float16 fields (at ``half_offsets``) are finite scales."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (count, block_bytes), dtype=torch.uint8, generator=generator)
    for offset in half_offsets:
        halves = (torch.rand(count, generator=generator) * 0.02 + 1e-4).to(torch.float16)
        blocks[:, offset : offset + 2] = halves.view(torch.uint8).view(count, 2)
    return blocks


def half(two_bytes) -> np.float32:
    return np.float32(np.frombuffer(bytes(two_bytes), dtype=np.float16)[0])


def scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """ggml's get_scale_min_k4."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def slow_q4_k(block: bytes) -> list[np.float32]:
    """ggml's dequantize_row_q4_K for one super-block, value by value, in float32."""
    d, dmin, scales, quants = half(block[0:2]), half(block[2:4]), block[4:16], block[16:]
    values = []
    for chunk in range(4):
        sc1, m1 = scale_min_k4(2 * chunk, scales)
        sc2, m2 = scale_min_k4(2 * chunk + 1, scales)
        d1, min1 = d * np.float32(sc1), dmin * np.float32(m1)
        d2, min2 = d * np.float32(sc2), dmin * np.float32(m2)
        q = quants[32 * chunk : 32 * chunk + 32]
        values += [d1 * np.float32(q[lane] & 0xF) - min1 for lane in range(32)]
        values += [d2 * np.float32(q[lane] >> 4) - min2 for lane in range(32)]
    return values


def slow_q6_k(block: bytes) -> list[np.float32]:
    """ggml's dequantize_row_q6_K for one super-block, value by value, in float32."""
    low, high = block[0:128], block[128:192]
    scales = np.frombuffer(bytes(block[192:208]), dtype=np.int8)
    d = half(block[208:210])
    values = [np.float32(0)] * 256
    for half_index in range(2):
        ql, qh, sc = low[64 * half_index :], high[32 * half_index :], scales[8 * half_index :]
        for lane in range(32):
            group = lane // 16
            q1 = ((ql[lane] & 0xF) | (((qh[lane] >> 0) & 3) << 4)) - 32
            q2 = ((ql[lane + 32] & 0xF) | (((qh[lane] >> 2) & 3) << 4)) - 32
            q3 = ((ql[lane] >> 4) | (((qh[lane] >> 4) & 3) << 4)) - 32
            q4 = ((ql[lane + 32] >> 4) | (((qh[lane] >> 6) & 3) << 4)) - 32
            base = 128 * half_index + lane
            for offset, scale, quant in ((0, sc[group], q1), (32, sc[group + 2], q2), (64, sc[group + 4], q3),
                                         (96, sc[group + 6], q4)):
                values[base + offset] = d * np.float32(scale) * np.float32(quant)
    return values


@pytest.mark.parametrize("count", [1, 3])
def test_q4_k_matches_ggml_value_by_value(count):
    blocks = random_blocks(count, gguf_weights.Q4_K_BLOCK_BYTES, (0, 2), seed=count)
    expected = torch.tensor([slow_q4_k(block.tolist()) for block in blocks], dtype=torch.float32)
    assert torch.equal(gguf_weights.dequantize_q4_k(blocks), expected)  # bit for bit


@pytest.mark.parametrize("count", [1, 2])
def test_q6_k_matches_ggml_value_by_value(count):
    blocks = random_blocks(count, gguf_weights.Q6_K_BLOCK_BYTES, (208,), seed=10 + count)
    expected = torch.tensor([slow_q6_k(block.tolist()) for block in blocks], dtype=torch.float32)
    assert torch.equal(gguf_weights.dequantize_q6_k(blocks), expected)


def test_dequantize_shapes_plain_types_and_refuses_what_it_cannot_read():
    values = torch.randn(3, 5)
    assert torch.equal(gguf_weights.dequantize(values.view(torch.uint8), "F32", (3, 5)), values)
    halves = values.to(torch.float16)
    assert torch.equal(gguf_weights.dequantize(halves.view(torch.uint8), "F16", (5, 3)), halves.view(5, 3))
    blocks = random_blocks(2, gguf_weights.Q4_K_BLOCK_BYTES, (0, 2), seed=3)
    assert gguf_weights.dequantize(blocks, "Q4_K", (2, 256)).shape == (2, 256)
    with pytest.raises(InputError, match="has 512 values"):
        gguf_weights.dequantize(blocks, "Q4_K", (3, 256))
    with pytest.raises(InputError, match="Q5_K is not one this converter dequantizes"):
        gguf_weights.dequantize(blocks, "Q5_K", (2, 256))
    with pytest.raises(InputError, match=r"uint8 \[blocks, 210\]"):
        gguf_weights.dequantize_q6_k(blocks)


def test_hugging_face_names():
    assert gguf_weights.hugging_face_name("blk.12.attn_k.bias") == "model.layers.12.self_attn.k_proj.bias"
    assert gguf_weights.hugging_face_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert gguf_weights.hugging_face_name("output.weight") == "lm_head.weight"
    with pytest.raises(InputError, match="'blk.0.attn_qkv.weight' has no Hugging Face name"):
        gguf_weights.hugging_face_name("blk.0.attn_qkv.weight")


def test_a_small_gguf_file_reads_back_under_hugging_face_names(tmp_path):
    gguf = pytest.importorskip("gguf")
    q4_k = random_blocks(4, gguf_weights.Q4_K_BLOCK_BYTES, (0, 2), seed=5)  # a [2, 512] weight
    q6_k = random_blocks(1, gguf_weights.Q6_K_BLOCK_BYTES, (208,), seed=6)  # a [1, 256] weight
    norm = torch.randn(7)
    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tensor("blk.0.ffn_up.weight", q4_k.numpy().reshape(2, -1), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.add_tensor("output.weight", q6_k.numpy(), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
    writer.add_tensor("output_norm.weight", norm.numpy())
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    weights = gguf_weights.state_dict_of(path, torch.float32)
    assert set(weights) == {"model.layers.0.mlp.up_proj.weight", "lm_head.weight", "model.norm.weight"}
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"],
                       gguf_weights.dequantize_q4_k(q4_k).view(2, 512))
    assert torch.equal(weights["lm_head.weight"], gguf_weights.dequantize_q6_k(q6_k))
    assert torch.equal(weights["model.norm.weight"], norm)
    other = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(other), "llama")
    writer.add_tensor("output_norm.weight", norm.numpy())
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    with pytest.raises(InputError, match="holds a llama model; this converter reads qwen2 files"):
        gguf_weights.state_dict_of(other)


@pytest.mark.parametrize("tied", [True, False])
def test_a_model_built_from_a_state_dict_saves_what_it_was_given(tmp_path, tied):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config).eval()
    weights = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    if tied:
        del weights["lm_head.weight"]  # a tied file has no output head of its own
    model_from_state_dict(config, weights).save_pretrained(tmp_path / "built")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "built").eval()
    saved = loaded.state_dict()
    assert all(torch.equal(saved[name], tensor) for name, tensor in reference.state_dict().items())  # bit for bit
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        # The same weights in other buffers: the CPU's matrix kernels may sum in another order (MKL and oneDNN pick
        # kernels by alignment), so the logits agree to float32 rounding of the sums, not bit for bit.
        torch.testing.assert_close(loaded(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-6)
    del weights["model.norm.weight"]
    with pytest.raises(InputError, match="missing .*model.norm.weight"):
        model_from_state_dict(config, weights)

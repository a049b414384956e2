"""Shared factories: tiny random Hugging Face models of every supported family, brute-force mask oracles, and the
repository's scripts as modules."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") == "1":
    # Triton 3.6's interpreter turns a loop bound held in a tensor into an int with int(array), which numpy 2 refuses
    # for arrays of shape (1,); the fused decode kernels loop over key blocks up to such a bound.
    from triton.runtime import interpreter

    _patch_lang_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if _patch_lang_tensor is not None:

        def _patch_lang_tensor_with_index(tensor, scope):
            _patch_lang_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

        interpreter._patch_lang_tensor = _patch_lang_tensor_with_index

FAMILY_NAMES = ("llama", "qwen2", "qwen3", "mistral")


def load_script(name: str):
    """A script as a module (scripts are tools, not a package): ``NAME`` is ``scripts/NAME.py``, a path with a slash
    is read from the repository root (a study's script: ``studies/QUESTION/NAME.py``)."""
    path = Path(__file__).resolve().parents[1] / (name if "/" in name else f"scripts/{name}.py")
    name = Path(name).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_model(family: str, *, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16, seed: int = 0):
    """A tiny random causal LM of ``family`` in float32, eval mode."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=97,
        hidden_size=heads * head_dim,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=1024,
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"use_sliding_window": False}),
        "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    }
    config_class, model_class, extra = classes[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**common, **extra))
    return model.eval()


def token_mask(length: int, block_size: int, mode: str, sink_blocks: int = 0, local_blocks: int = 1) -> torch.Tensor:
    """Brute-force [L, L] bool mask of one head, written token by token from the block rules (`patterns.block_tables`)."""
    mask = torch.zeros(length, length, dtype=torch.bool)
    for q in range(length):
        for k in range(q + 1):
            qb, kb = q // block_size, k // block_size
            if mode == "full":
                mask[q, k] = True
            elif mode == "ssa":
                mask[q, k] = kb < sink_blocks or kb > qb - local_blocks
            else:
                raise ValueError(mode)
    return mask


def streaming_suffix_case(count: int, sink: int, local: int, head_dim: int, scale: float, gap: int = 6):
    """Float64 inputs of `streaming_suffix_attention` (2 streaming KV heads of 3 grouped queries, a chunk of
    ``count`` queries starting ``gap`` tokens after a complete window) and the expected output by the token rule
    (`token_attention` at the logical positions).

    Returns:
        ((query, sink_key, sink_value, window_key, window_value), expected).
    """
    from elastic_attention.cache.token_attention import token_attention

    first = sink + local + gap
    query = torch.randn(2, 3, count, head_dim, dtype=torch.float64)
    sink_key, sink_value = torch.randn(2, 2, sink, head_dim, dtype=torch.float64)
    window_key, window_value = torch.randn(2, 2, local + count, head_dim, dtype=torch.float64)
    positions = torch.cat([torch.arange(sink), torch.arange(first - local, first + count)])
    expected = token_attention(query, torch.cat([sink_key, window_key], 1), torch.cat([sink_value, window_value], 1),
                               torch.arange(first, first + count), positions, torch.ones(2, dtype=torch.bool),
                               sink_tokens=sink, local_tokens=local, scale=scale)
    return (query, sink_key, sink_value, window_key, window_value), expected


def per_sample_routers(model):
    """Routers whose decisions depend strongly on the input, so samples of one batch route differently."""
    from elastic_attention import routers_of

    with torch.no_grad():
        for router in routers_of(model).values():
            for parameter in router.parameters():
                parameter.mul_(300.0)


def left_padded_batch(seed: int, prompt: int, padding: int, steps: int, device="cpu"):
    """A batch of 2 random prompts (tokens 3..89, from ``seed``) whose second sample starts with ``padding`` padding
    positions, and ``steps`` random tokens per sample to feed after them.

    Returns:
        (ids [2, prompt], attention mask [2, prompt], continuation [2, steps]) on ``device``.
    """
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (2, prompt), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :padding] = 0
    continuation = torch.randint(3, 90, (2, steps), generator=generator)
    return ids.to(device), mask.to(device), continuation.to(device)


def teacher_forced_decode(model, ids, mask, continuation, cache=None):
    """Prefill ``ids`` [B, L] (padding ``mask``), then feed ``continuation`` [B, steps] one token per step.

    Returns:
        (next-token logits [steps + 1, B, vocab] of the prefill and of every step, the cache the steps used).
    """
    logits = []
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        cache = output.past_key_values
        logits.append(output.logits[:, -1])
        for step in range(continuation.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            output = model(input_ids=continuation[:, step : step + 1], attention_mask=mask, past_key_values=cache,
                           use_cache=True)
            logits.append(output.logits[:, -1])
    return torch.stack(logits), cache


def caches_taking_turns(config, device, tolerance: float) -> None:
    """Caches of one tiny llama in turn on ``device`` (float32), each teacher-forced and its logits checked against
    eager steps (within ``tolerance``): one routed to a full head per layer sets up a decode step; one routed all-SSA
    on other prompts fits it (its segments within the captured key splits) and takes it, which ends the first cache's
    static mode with its steps counted; the first cache, continued, takes it back; a longer prompt (a larger
    capacity) does not fit and sets up a second step; the first prompts again take the first step, which covers
    fewer entries."""
    from elastic_attention import ElasticCache, attach, force_routing

    model = tiny_model("llama").to(device)
    attach(model, config, backend="reference")
    one_full = torch.tensor([[True, False], [False, True]])

    def run(routing, ids, mask, continuation, graphs, cache=None):
        force_routing(model, routing)
        if cache is None:
            return teacher_forced_decode(model, ids, mask, continuation, ElasticCache(model, cuda_graphs=graphs))
        logits = []
        with torch.no_grad():
            for step in range(continuation.shape[1]):
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits.append(model(input_ids=continuation[:, step : step + 1], attention_mask=mask,
                                    past_key_values=cache, use_cache=True).logits[:, -1])
        return torch.stack(logits), cache

    def checked(routing, ids, mask, continuation, cache=None, eager_cache=None):
        graphed, cache = run(routing, ids, mask, continuation, True, cache)
        eager, eager_cache = run(routing, ids, mask, continuation, False, eager_cache)
        assert float((graphed - eager).abs().max()) < tolerance
        return cache, eager_cache

    kept = model.forward.kept_graphs
    first_ids, first_mask, first_steps = left_padded_batch(6, 30, 5, 12, device)
    other_ids, other_mask, other_steps = left_padded_batch(7, 41, 5, 5, device)
    long_ids, long_mask, long_steps = left_padded_batch(8, 300, 5, 3, device)
    first, first_eager = checked(one_full, first_ids, first_mask, first_steps[:, :4])
    step = first.decode_graph
    assert kept == {(2, False): [step]}
    other, _ = checked("sparse", other_ids, other_mask, other_steps)
    assert other.decode_graph is step and first.static_capacity is None and first.decode_graph is None
    assert first.get_seq_length() == first_ids.shape[1] + 4  # its static steps counted on the host
    mask_now = torch.cat([first_mask, torch.ones_like(first_mask[:, :4])], dim=1)
    first, first_eager = checked(one_full, None, mask_now, first_steps[:, 4:8], first, first_eager)
    assert first.decode_graph is step and other.static_capacity is None
    longer, _ = checked(one_full, long_ids, long_mask, long_steps)
    assert longer.decode_graph is not step and kept[(2, False)] == [step, longer.decode_graph]
    again, _ = checked(one_full, first_ids, first_mask, first_steps[:, :6])
    assert again.decode_graph is step and kept[(2, False)] == [longer.decode_graph, step]


def generate_with_and_without_graphs(config, ids, mask, new_tokens, first_stop):
    """Per-sample-routed tiny llamas (on the device of ``ids``), attached with CUDA graphs on and off, each
    generating greedily, greedily with an EOS that stops the first sample after at least ``first_stop`` new tokens
    (a token the other sample never produces), and with seeded sampling.

    Returns:
        ({graphs: (greedy, stopped, sampled sequences)}, {graphs: (the greedy and the sampled run's caches)}, the
        stop step).
    """
    from elastic_attention import attach

    prompt, results, caches, stop = ids.shape[1], {}, {}, None
    for graphs in (True, False):
        model = tiny_model("llama").to(ids.device)
        attach(model, config, backend="reference", cuda_graphs=graphs)
        per_sample_routers(model)
        with torch.no_grad():
            greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=0, return_dict_in_generate=True)
            first, second = greedy.sequences[:, prompt:].tolist()
            stop = next(k for k in range(first_stop, new_tokens) if first[k] not in first[:k] + second)
            stopped = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=0, eos_token_id=first[stop])
            torch.manual_seed(3)
            sampled = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                                     top_k=0, pad_token_id=0, return_dict_in_generate=True)
        results[graphs] = greedy.sequences, stopped, sampled.sequences
        caches[graphs] = greedy.past_key_values, sampled.past_key_values
    return results, caches, stop


def fused_decode_case(device: str, dtype: torch.dtype, group: int, head_dim: int, lengths: list[int],
                      max_entries: int | None = None):
    """One fused decode step (`decode_step`) over (sequence, KV head) segments of the given lengths, half of them full
    stores and half rings (sink 5, local 100: empty, filling, at and past the wrap point), against float64 attention
    over each segment's visible positions of the same ``dtype``-rounded values. ``max_entries``: the bound the key
    splits cover (None: the longest segment's entries after the step; a captured step passes its capacity).

    Returns:
        (actual, expected): [len(lengths), 3 * group, 1, head_dim] float64 on the CPU.
    """
    from elastic_attention.cache.triton_decode import DecodeSegments, decode_step

    torch.manual_seed(group * head_dim)
    sink, local, num_kv = 5, 100, 3
    ring_size = sink + local
    is_full = lambda n, h: (n + h) % 2 == 0  # noqa: E731
    columns, kept, history = [[], [], [], []], [], {}
    for n, length in enumerate(lengths):
        for h in range(num_kv):
            past = torch.randn(2, length, head_dim, dtype=torch.float64)  # keys, values by position
            history[n, h] = past
            full = is_full(n, h)
            store = torch.randn(2, length + 17 if full else ring_size, head_dim, dtype=torch.float64)
            positions = torch.full((ring_size,), -1, dtype=torch.long)
            survivors = torch.arange(length) if full else torch.cat(
                [torch.arange(min(sink, length)), torch.arange(min(length, max(sink, length - local)), length)])
            slots = survivors if full else torch.where(survivors < sink, survivors, sink + (survivors - sink) % local)
            store[:, slots] = past[:, survivors]
            positions[slots[:ring_size]] = survivors[:ring_size]
            store, positions = store.to(device, dtype), positions.to(device)
            kept += [store, positions]
            columns[0].append(store[0].data_ptr())
            columns[1].append(store[1].data_ptr())
            columns[2].append(0 if full else positions.data_ptr())
            columns[3].append(length)
    segments = DecodeSegments.from_columns(*columns, num_kv_heads=num_kv, device=torch.device(device))
    assert segments.aligned
    new_entries = torch.randn(2, len(lengths), num_kv, 1, head_dim, dtype=torch.float64)
    query = torch.randn(len(lengths), num_kv * group, 1, head_dim, dtype=torch.float64)
    actual = decode_step(query.to(device, dtype), *new_entries.to(device, dtype), segments, 0.1, sink_tokens=sink,
                         local_tokens=local, max_entries=max_entries or max(lengths) + 1)
    assert segments.lengths.tolist() == [length + 1 for length in lengths for _ in range(num_kv)]
    expected = torch.empty_like(query)
    for (n, h), past in history.items():
        length = lengths[n]
        entries = torch.cat([past, new_entries[:, n, h]], dim=1)  # positions 0 .. length
        visible = torch.arange(length + 1)
        if not is_full(n, h):
            visible = visible[(visible < sink) | (visible > length - local)]
            ring_positions = kept[2 * (n * num_kv + h) + 1].cpu()
            assert sorted(ring_positions[ring_positions >= 0].tolist()) == visible.tolist()
        keys, values = entries[:, visible].to(dtype).double()
        rows = query[n, h * group : (h + 1) * group, 0].to(dtype).double()
        expected[n, h * group : (h + 1) * group, 0] = torch.softmax(rows @ keys.T * 0.1, -1) @ values
    return actual.double().cpu(), expected


def masked_attention_float64(query, key, value, mask, scale, softcap=None):
    """Oracle: softmax attention in float64 with an explicit [Hq, Lq, Lk] mask. query [Hq, Lq, D], key [Hkv, Lk, D];
    with ``softcap`` c the scores become c * tanh(scores / c) first (Gemma 2)."""
    group = query.shape[0] // key.shape[0]
    key = key.double().repeat_interleave(group, dim=0)
    value = value.double().repeat_interleave(group, dim=0)
    scores = query.double() @ key.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


@pytest.fixture(params=FAMILY_NAMES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def random_suite_backbone(tmp_path_factory):
    """A tiny random Qwen3 with the suite tokenizer, saved like a real checkpoint: a folder for from_pretrained."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from elastic_attention.evaluation.synthetic.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    path = tmp_path_factory.mktemp("random_suite_backbone")
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

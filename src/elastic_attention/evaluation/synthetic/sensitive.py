"""Sparsity-sensitive tasks of the synthetic suite: the evidence can sit anywhere in the context."""

from __future__ import annotations

from collections.abc import Sequence

from elastic_attention.errors import InputError
from elastic_attention.evaluation.seeded_random import SampleRandom
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic.context import (
    INSTRUCTIONS,
    needle_depth,
    needles,
    require_count,
    sensitive_context,
    task_row,
)
from elastic_attention.evaluation.synthetic.words import KEY_TOKENS, NEEDLE_MARKER, VALUE_TOKENS, VARIABLE_MARKER, VARIABLE_TOKENS


def needle_single(length: int, seed: int, *, depth: float | None = None) -> Row:
    """One key/value needle in filler; the question asks the key's value.

    Args:
        length: rendered prompt length in tokens (at least about 50).
        seed: sample seed.
        depth: needle depth in [0, 1]; ``None`` draws it uniformly.

    Returns:
        A row with answer ``"v42"``; ``metadata["key"]``.
    """
    rng = SampleRandom(seed)
    key, value = rng.choice(KEY_TOKENS), rng.choice(VALUE_TOKENS)
    instruction = INSTRUCTIONS["needle_single"]
    question = f"question : what is the value of {key} ?"
    inserts = [(needle_depth(rng, depth), [NEEDLE_MARKER, key, value, "."])]
    context, layout = sensitive_context(rng, "needle_single", length, instruction, question, inserts)
    return task_row("needle_single", length, seed, instruction, question, value, context, layout, {"key": key})


def needle_multikey(length: int, seed: int, *, depth: float | None = None, num_keys: int = 4) -> Row:
    """``num_keys`` needles with distinct keys and values; one key is asked.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        depth: depth of the asked needle in [0, 1]; ``None`` draws it uniformly. Other needles are uniform.
        num_keys: number of needles, 2 to 64.

    Returns:
        A row with the asked key's value as answer; ``metadata["key"]``, ``metadata["keys"]`` (all, in insertion
        order of the list, the asked one first).
    """
    require_count("num_keys", num_keys, 2, 64)
    rng = SampleRandom(seed)
    keys = rng.sample(KEY_TOKENS, num_keys)
    values = rng.sample(VALUE_TOKENS, num_keys)
    instruction = INSTRUCTIONS["needle_multikey"]
    question = f"question : among all hidden keys , what is the value of {keys[0]} ?"
    depths = [needle_depth(rng, depth)] + [rng.fraction() for _ in keys[1:]]
    inserts = list(zip(depths, needles(keys, values), strict=True))
    context, layout = sensitive_context(rng, "needle_multikey", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][1:]
    layout["offsets"] = layout["offsets"][:1]
    extra = {"key": keys[0], "keys": keys}
    return task_row("needle_multikey", length, seed, instruction, question, values[0], context, layout, extra)


def needle_multivalue(
    length: int,
    seed: int,
    *,
    depths: Sequence[float] | None = None,
    num_values: int = 2,
    num_distractors: int = 2,
) -> Row:
    """One key with ``num_values`` values at different depths, plus distractor needles of other keys.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        depths: ``num_values`` depths in [0, 1] (sorted before use); ``None`` draws them uniformly.
        num_values: values of the asked key, 2 to 16.
        num_distractors: needles of other keys, 0 to 32, at uniform depths.

    Returns:
        A row whose answer lists the key's values in order of appearance (``"v3 v91 v40 v7"``).
    """
    require_count("num_values", num_values, 2, 16)
    require_count("num_distractors", num_distractors, 0, 32)
    rng = SampleRandom(seed)
    keys = rng.sample(KEY_TOKENS, 1 + num_distractors)
    values = rng.sample(VALUE_TOKENS, num_values + num_distractors)
    if depths is None:
        needle_depths = sorted(rng.fraction() for _ in range(num_values))
    else:
        if len(depths) != num_values:
            raise InputError(f"`depths` must have `num_values` ({num_values}) entries, got {len(depths)}")
        needle_depths = sorted(needle_depth(rng, d) for d in depths)
    instruction = INSTRUCTIONS["needle_multivalue"]
    question = f"question : list all values of {keys[0]} in order ?"
    asked = needles([keys[0]] * num_values, values[:num_values])
    inserts = list(zip(needle_depths, asked, strict=True))
    inserts += [(rng.fraction(), words) for words in needles(keys[1:], values[num_values:])]
    context, layout = sensitive_context(rng, "needle_multivalue", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][num_values:]
    layout["offsets"] = layout["offsets"][:num_values]
    answer = " ".join(values[:num_values])
    return task_row("needle_multivalue", length, seed, instruction, question, answer, context, layout, {"key": keys[0]})


def variable_tracking(length: int, seed: int, *, num_chains: int = 2, num_hops: int = 2) -> Row:
    """Chains of variable assignments spread over the context; list the variables holding the asked value.

    Chain ``c`` is ``VAR a = v .``, ``VAR b = a .``, ``VAR c = b .`` ... in increasing depth, so every variable of
    the chain ends up holding ``v``. Chains are interleaved at random depths.

    Args:
        length: rendered prompt length in tokens.
        seed: sample seed.
        num_chains: chains, 1 to 8 (one is asked; the others are distractors with other values).
        num_hops: variables per chain, 1 to 12.

    Returns:
        A row whose answer is the asked chain's variables in order of assignment (``"x3 x8 x51 x20"``);
        ``metadata["value"]`` and ``metadata["chains"]`` (the variables of every chain, the asked one first).
    """
    require_count("num_chains", num_chains, 1, 8)
    require_count("num_hops", num_hops, 1, 12)
    rng = SampleRandom(seed)
    variables = rng.sample(VARIABLE_TOKENS, num_chains * num_hops)
    values = rng.sample(VALUE_TOKENS, num_chains)
    chains = [variables[c * num_hops : (c + 1) * num_hops] for c in range(num_chains)]
    inserts: list[tuple[float, list[str]]] = []
    for chain, value in zip(chains, values, strict=True):
        sources = [value, *chain[:-1]]
        chain_depths = sorted(rng.fraction() for _ in chain)
        for depth, target, source in zip(chain_depths, chain, sources, strict=True):
            inserts.append((depth, [VARIABLE_MARKER, target, "=", source, "."]))
    instruction = INSTRUCTIONS["variable_tracking"]
    question = f"question : which variables hold the value {values[0]} ?"
    context, layout = sensitive_context(rng, "variable_tracking", length, instruction, question, inserts)
    layout["distractor_offsets"] = layout["offsets"][num_hops:]
    layout["offsets"] = layout["offsets"][:num_hops]
    answer = " ".join(chains[0])
    extra = {"value": values[0], "chains": chains}
    return task_row("variable_tracking", length, seed, instruction, question, answer, context, layout, extra)

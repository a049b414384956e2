"""How the fused decode step splits keys (`triton_decode._key_splits`), against a slow rule: the fewest keys per split,
in whole blocks, that keep the step near its target count of programs, each segment within its most splits and every
split at its least keys; then as many splits as the longest segment needs."""

import itertools

import pytest
import torch

from elastic_attention.cache import triton_decode
from elastic_attention.cache.triton_decode import DecodeKernelOptions


def _slow_rule(max_entries: int, total_entries: int, options: DecodeKernelOptions, processors: int):
    programs = options.programs_per_processor * processors
    for keys in itertools.count(options.block_keys, options.block_keys):
        if (keys * programs >= total_entries and keys * options.max_splits >= max_entries
                and keys >= options.min_split_keys):
            return -(-max_entries // keys), keys


@pytest.mark.parametrize("options", [
    DecodeKernelOptions(), DecodeKernelOptions(block_keys=128, programs_per_processor=2, max_splits=8),
    DecodeKernelOptions(min_split_keys=500), DecodeKernelOptions(block_keys=32, min_split_keys=32)])
def test_key_splits_follow_the_slow_rule(options, monkeypatch):
    monkeypatch.setattr(triton_decode, "_processors", lambda device: 7)
    for max_entries, total_entries in [(1, 1), (105, 1000), (3001, 3001), (3001, 3001 * 16 + 105 * 16),
                                       (40_000, 41_000), (131_073, 8 * 131_073), (1153, 18_448)]:
        splits, keys = triton_decode._key_splits(max_entries, total_entries, options, torch.device("cpu"))
        assert (splits, keys) == _slow_rule(max_entries, total_entries, options, 7)
        assert keys % options.block_keys == 0 and (splits - 1) * keys < max_entries <= splits * keys

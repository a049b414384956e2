"""The retrieval signal against a slow per-query rule (float64, odd sizes, GQA 2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("retrieval_signal", Path(__file__).with_name("retrieval_signal.py"))
retrieval_signal = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(retrieval_signal)


def _slow_mass(query, key, scale, last, block, sink_blocks, local_blocks):
    heads, length = query.shape[0], key.shape[1]
    group = heads // key.shape[0]
    mass = torch.zeros(heads, dtype=torch.float64)
    for head in range(heads):
        for position in range(max(0, length - last), length):
            weights = torch.softmax(key[head // group, : position + 1] @ query[head, position] * scale, dim=0)
            for index in range(position + 1):
                if sink_blocks <= index // block <= position // block - local_blocks:
                    mass[head] += weights[index] / min(last, length)
    return mass.view(-1, group).mean(-1)


def test_outside_window_mass_is_the_per_query_rule():
    generator = torch.Generator().manual_seed(3)
    for length, last in ((1000, 5), (129, 7), (300, 300)):
        query = torch.randn(4, length, 16, dtype=torch.float64, generator=generator)
        key = torch.randn(2, length, 16, dtype=torch.float64, generator=generator)
        got = retrieval_signal.outside_window_mass(query, key, 0.25, last, 64, 1, 2)
        torch.testing.assert_close(got.double(), _slow_mass(query, key, 0.25, last, 64, 1, 2), rtol=1e-5, atol=1e-6)

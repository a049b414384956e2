"""Benchmarks run by `elastic-attention bench` (one layer; end-to-end prefill; decode with the bounded
cache; a training step; a CPU prefill)."""

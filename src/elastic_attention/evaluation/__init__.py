"""Evaluation: the synthetic long-context task suite, its word-level tokenizer, runners, metrics and reports."""

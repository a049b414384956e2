"""Evaluation: the synthetic and code long-context task suites, runners, metrics and reports."""

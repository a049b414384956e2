"""Loads the rows of the elastic_suite_tiny lm-eval task from the JSONL beside this file (no network)."""

from pathlib import Path

ROWS = Path(__file__).resolve().parent / "elastic_suite_tiny.jsonl"


def suite_rows(**_metadata):
    """The task's rows as a DatasetDict with one ``test`` split."""
    import datasets

    return datasets.DatasetDict({"test": datasets.load_dataset("json", data_files=str(ROWS), split="train")})

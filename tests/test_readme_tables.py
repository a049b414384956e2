"""The README's results are the canonical results files': its tables equal what `benchmarks/readme_tables.py` makes of
them, its Limitations stay short with a results file for each limit, and the catalogue indexes every results file."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_tables_are_what_the_results_files_give(tables):
    blocks = tables.readme_blocks(README.read_text())
    assert sorted(blocks) == sorted(tables.TABLES)
    for name, make in tables.TABLES.items():
        assert blocks[name] == make(), f"README.md's {name} table is stale: python -m benchmarks.readme_tables --write"


def test_a_changed_number_in_a_results_file_changes_the_readme_table(tables, tmp_path, monkeypatch):
    """The control: the tables are read from the files, so the README test fails when a file moves on alone."""
    claim = tables.CLAIMS["request"]
    document = json.loads((RESULTS / f"{claim}.json").read_text())
    before = tables.request_table(document)
    for row in document["results"]:
        if row["mode"] == "elastic":
            row["ttft_s"] *= 2
    (tmp_path / f"{claim}.json").write_text(json.dumps(document))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    after = tables.TABLES["request"]()
    assert after != before and "0.458 s vs 0.349 s (0.76x)" in after  # robust 32K batch 1: 0.229 s, now twice


def test_the_limitations_are_short_and_cite_a_results_file_for_each_limit():
    text = README.read_text()
    limitations = section(text, "## Limitations")
    lines = [line for line in limitations.splitlines() if line.strip()]
    assert 0 < len(lines) <= 12
    bullets = re.split(r"\n(?=- )", limitations.strip())
    for bullet in bullets:
        cited = [target for target in LINK.findall(bullet) if target.startswith("benchmarks/results/")]
        assert cited and all((ROOT / target).is_file() for target in cited), bullet
        assert re.search(r"\d", bullet), bullet  # each limit with its number
    assert not re.search(r"\bissues? \d|\bbars?\b", text, flags=re.IGNORECASE)  # no issue numbers, no bars


def indexed(index: Path) -> set[Path]:
    return {(index.parent / target).resolve() for target in LINK.findall(index.read_text())}


def test_every_results_file_is_in_the_catalogue_and_the_top_level_stays_small():
    listed = indexed(RESULTS / "README.md")
    files = [path for path in RESULTS.rglob("*") if path.is_file() and path != RESULTS / "README.md"]
    assert sorted(str(path.relative_to(RESULTS)) for path in files if path.resolve() not in listed) == []
    assert len(list(RESULTS.iterdir())) <= 40


def test_every_study_with_results_names_them_in_its_readme():
    for study in sorted(path for path in (ROOT / "studies").iterdir() if (path / "results").is_dir()):
        listed = indexed(study / "README.md")
        missing = [path for path in (study / "results").rglob("*")
                   if path.is_file() and not any(path.resolve() == item or item in path.resolve().parents
                                                 for item in listed)]
        assert missing == [], study.name


def test_scripts_and_configs_hold_only_tools_and_canonical_configs():
    """A handful of tools a user runs, one config per model and recipe; research goes to studies/."""
    assert len([path for path in (ROOT / "scripts").iterdir() if path.is_file()]) <= 6
    assert len([path for path in (ROOT / "configs").iterdir() if path.is_file()]) <= 8

"""The documentation stays true to the code: every public name is in the API reference, every page the README
links exists, and the README stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

import elastic_attention

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_is_in_the_api_reference():
    headings = set(re.findall(r"^### `([^`]+)`", (ROOT / "docs" / "api.md").read_text(), flags=re.MULTILINE))
    assert sorted(set(elastic_attention.__all__) - headings) == []
    assert sorted(headings - set(elastic_attention.__all__)) == []  # nothing documented that is not public


def test_the_readme_links_pages_that_exist_and_stays_short():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?:docs|benchmarks|configs|src|scripts)/[^)#]+)(?:#[^)]*)?\)", readme)
    assert links and [link for link in links if not (ROOT / link).exists()] == []
    assert len(readme.splitlines()) <= 260

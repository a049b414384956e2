"""Run configs as frozen dataclasses read from YAML: ``key=value`` overrides, unknown keys and wrong types named.

Shared by the router trainer's `TrainConfig` and the pretraining recipe's `PretrainConfig`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from elastic_attention.errors import ConfigError


def read_yaml(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """A YAML mapping with ``key=value`` / ``section.key=value`` overrides applied (values parsed as YAML).

    Raises:
        ConfigError: the file is not a mapping, an override is not ``key=value``, or it sets a key inside a value
            that is not a section.
        FileNotFoundError: no file at ``path``.
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, got {type(data).__name__}")
    for override in overrides or []:
        if "=" not in override:
            raise ConfigError(f"override {override!r} must look like key=value or section.key=value")
        key, value = override.split("=", 1)
        target = data
        *parents, leaf = key.split(".")
        for depth, parent in enumerate(parents):
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                section = ".".join(parents[: depth + 1])
                raise ConfigError(f"override {override!r}: `{section}` is a value, not a section of keys")
        target[leaf] = yaml.safe_load(value)
    return data


def check_types(instance, prefix: str) -> None:
    """ConfigError naming a field whose value is not of its annotated type (int, float, bool, str, tuple of them)."""
    check_field_types(type(instance), {item.name: getattr(instance, item.name)
                                       for item in dataclasses.fields(instance)}, prefix)


def check_field_types(kind, values: dict[str, Any], prefix: str) -> None:
    """`check_types` on the ``values`` a dataclass ``kind`` is about to be built from (before its own checks
    compare them)."""
    expected = {"int": int, "float": (int, float), "bool": bool, "str": str}
    for item in dataclasses.fields(kind):
        if item.name not in values:
            continue
        annotation = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", "")
        value = values[item.name]
        if annotation.endswith("| None") and value is None:
            continue
        base = annotation.removesuffix(" | None")
        if base in expected:
            kind_of_value = expected[base]
            wrong = not isinstance(value, kind_of_value) or (base != "bool" and isinstance(value, bool))
            if wrong:
                raise ConfigError(f"`{prefix}{item.name}` must be {_ARTICLE[base]}, got {value!r}{_yaml_hint(value)}")
        elif base.startswith("tuple[") and base.endswith(", ...]"):
            inner = base[len("tuple["): -len(", ...]")]
            if inner in expected and (not isinstance(value, (tuple, list)) or not all(
                    isinstance(v, expected[inner]) and not isinstance(v, bool) for v in value)):
                raise ConfigError(f"`{prefix}{item.name}` must be a list of {inner} values, got {value!r}")


def check_number(value, name: str, low: float = 0.0, high: float = 1.0) -> float:
    """``value`` as a float when it is a number in [low, high]; ConfigError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"`{name}` must be a number in [{low:g}, {high:g}], got {value!r}{_yaml_hint(value)}")
    return float(value)


_ARTICLE = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _yaml_hint(value) -> str:
    """How to write a number that YAML read as text (YAML 1.1 reads ``1e-3`` as a string, ``1.0e-3`` as a float)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (YAML reads a number without a dot before its exponent as text: write 1.0e-3, not 1e-3)"
    return ""


def build_section(kind, value, name: str):
    """The dataclass ``kind`` of a config section from its mapping (lists become tuples); ConfigError on a key it
    does not know or a value that is not a mapping."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"`{name}` must be a section of keys, got {value!r}")
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(f"unknown `{name}` keys {unknown}; known: {sorted(known)}")
    value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    check_field_types(kind, value, f"{name}.")
    return kind(**value)


def unknown_keys(kind, data: dict[str, Any], what: str, other: tuple[str, str, str] | None = None) -> None:
    """ConfigError naming the top-level keys of ``data`` that ``kind`` has no field for.

    ``other`` is ``(key, kind of config, command)``: an unknown ``key`` marks a config of that other kind, and the
    message says which command runs it.
    """
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        hint = ""
        if other is not None and other[0] in unknown:
            hint = f" (this looks like a {other[1]} config: run it with `elastic-attention {other[2]}`)"
        raise ConfigError(f"unknown {what} keys {unknown}; known: {sorted(known)}{hint}")

"""Typed configs: one pydantic model per stage is the single source for CLI flags, YAML and docs.

Each stage module defines its own `StageConfig` subclass next to the code that reads it (so stages
can evolve independently); this module holds the machinery that turns such a class into argparse
flags and merges YAML < CLI. Unknown keys fail everywhere (extra="forbid").
"""

from __future__ import annotations

import argparse
import types
import warnings
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


# `json: bool` is a natural flag name (--json); shadowing pydantic's deprecated .json() is harmless.
warnings.filterwarnings("ignore", message='Field name "json"')


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and key."""


class StageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(tp: Any) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def add_config_args(parser: argparse.ArgumentParser, cls: type[StageConfig]) -> None:
    """One flag per field. Defaults stay None here so that 'not given' never overrides YAML."""
    parser.add_argument("--config", type=Path, default=None, help="YAML file whose keys are these flags' names")
    for name, field in cls.model_fields.items():
        tp = _unwrap_optional(field.annotation)
        origin = get_origin(tp)
        default = None if field.is_required() or callable(field.default) else field.default
        help_ = (field.description or "") + (" (required)" if field.is_required() else
                                             f" (default: {default})" if default not in (None, "") else "")
        kw: dict[str, Any] = {"dest": name, "default": None, "help": help_.replace("%", "%%")}  # argparse formats help
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif origin in (list, tuple):
            inner = get_args(tp)[0] if get_args(tp) else str
            kw.update(nargs="+", type=_scalar_type(inner))
        elif origin is Literal:
            kw.update(choices=list(get_args(tp)), type=type(get_args(tp)[0]))
        else:
            kw["type"] = _scalar_type(tp)
        parser.add_argument(_flag(name), **kw)


def _scalar_type(tp: Any):
    if tp in (int, float, str):
        return tp
    if tp is Path:
        return Path
    return str


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read YAML config: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of flag names to values")
    return {k.replace("-", "_"): v for k, v in data.items()}


def build_config(cls: type[StageConfig], args: argparse.Namespace | dict | None = None,
                 yaml_path: Path | None = None) -> StageConfig:
    """YAML < explicit CLI values. Validation errors name the offending key (and the YAML file)."""
    cli = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    yaml_path = yaml_path or cli.pop("config", None)
    cli.pop("config", None)
    merged: dict[str, Any] = load_yaml(yaml_path) if yaml_path else {}
    merged.update({k: v for k, v in cli.items() if v is not None and k in cls.model_fields})
    try:
        return cls(**merged)
    except ValidationError as e:
        where = f" in {yaml_path}" if yaml_path else ""
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"invalid {cls.__name__}{where}:\n  " + "\n  ".join(lines)) from None


def config_to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

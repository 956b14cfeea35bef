"""Typed configs: one pydantic model per stage is the single source for CLI flags, YAML and docs.

Each stage module defines its own `StageConfig` subclass next to the code that reads it (so stages
can evolve independently); this module holds the machinery that turns such a class into argparse
flags and merges YAML < CLI. Unknown keys fail everywhere (extra="forbid").
"""

from __future__ import annotations

import argparse
import difflib
import types
import warnings
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

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
    """`X | None` -> X, and an Annotated type (a shared field type with a validator, eyas.flags) -> its base."""
    if get_origin(tp) is Annotated:
        return _unwrap_optional(get_args(tp)[0])
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    return tp


def add_config_args(parser: argparse.ArgumentParser, cls: type[StageConfig]) -> None:
    """One flag per field. Defaults stay None here so that 'not given' never overrides YAML.

    Required fields are listed in their own group and in the usage line without brackets; argparse does not
    enforce them itself because a --config file may supply them (build_config reports what is missing)."""
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="YAML file whose keys are these flags' names (flags given here override it)")
    required = parser.add_argument_group("required (here or in --config)")
    needed = []
    for name, field in cls.model_fields.items():
        tp = _unwrap_optional(field.annotation)
        origin = get_origin(tp)
        default = None if field.is_required() or callable(field.default) else field.default
        if field.is_required():
            note = ""
        elif default not in (None, ""):
            note = f" (default: {default})"
        else:
            note = ""
        help_ = (field.description or "") + note
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
        (required if field.is_required() else parser).add_argument(_flag(name), **kw)
        if field.is_required():
            needed.append(f"{_flag(name)} {name.upper()}")
    parser.usage = f"{parser.prog} {' '.join(needed)} [--config FILE] [options]".replace("  ", " ")


def check_flags(unknown: list[str], cls: type[StageConfig]) -> str:
    """argparse's leftovers as one message, with the nearest real flag for each misspelt one."""
    flags = [_flag(n) for n in cls.model_fields] + ["--config", "--help"]
    flags += [f"--no-{n.replace('_', '-')}" for n, f in cls.model_fields.items() if _unwrap_optional(f.annotation) is bool]
    parts = []
    for arg in unknown:
        if not arg.startswith("-"):
            parts.append(f"unexpected argument {arg!r}")
            continue
        near = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.6)
        parts.append(f"unknown flag {arg}" + (f" (did you mean {near[0]}?)" if near else ""))
    return "; ".join(parts)


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
    """YAML < explicit CLI values. Errors name the flag (`--ttt-steps`), and the YAML file and key when the
    value came from there; a misspelt key gets the nearest real one."""
    cli = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    yaml_path = yaml_path or cli.pop("config", None)
    cli.pop("config", None)
    from_yaml: dict[str, Any] = load_yaml(yaml_path) if yaml_path else {}
    given = {k: v for k, v in cli.items() if v is not None and k in cls.model_fields}
    try:
        return cls(**{**from_yaml, **given})
    except ValidationError as e:
        lines = [_explain(err, cls, yaml_path if str(err["loc"][0]) in from_yaml and str(err["loc"][0]) not in given
                          else None) for err in e.errors()]
        raise ConfigError("invalid settings:\n  " + "\n  ".join(lines)) from None


def _explain(err: dict, cls: type[StageConfig], yaml_path: Path | None) -> str:
    key = str(err["loc"][0]) if err["loc"] else ""
    where = f"{yaml_path}: key {key!r} (flag {_flag(key)})" if yaml_path else _flag(key)
    sub = "".join(f"[{p}]" for p in err["loc"][1:])
    if err["type"] == "extra_forbidden":
        near = difflib.get_close_matches(key, list(cls.model_fields), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r} ({_flag(near[0])})?" if near else ""
        src = f"{yaml_path}: unknown key {key!r}" if yaml_path else f"unknown setting {key!r}"
        return src + hint
    if err["type"] == "missing":
        return f"{_flag(key)} is required (give it on the command line or as '{key}:' in --config FILE)"
    got = err.get("input")
    return f"{where}{sub}: {err['msg']}" + (f" (got {got!r})" if not isinstance(got, dict) else "")


def config_to_yaml(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)

"""`eyas CMD --help` without importing CMD's stage module (and so without torch: 1-30 s on a busy box).

Each stage's config class lives beside the code that reads it, in a module that imports torch. For help
only the fields matter, so the class statement is read from the module's source and run on its own,
with the few module-level names its fields use (string constants, possibly imported from light eyas
modules) resolved from source the same way. Methods and validators are dropped: they do not change
the flags. Anything this cannot resolve falls back to the real import, so help is never wrong, at
worst slow; tests compare both paths for every command.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent
_TYPING = ("Any", "Literal", "Optional", "Union")


class _Unresolved(Exception):
    pass


def _module_file(module: str) -> Path:
    parts = module.split(".")
    if parts[0] != "eyas":
        raise _Unresolved(module)
    path = _ROOT.joinpath(*parts[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _tree(module: str) -> ast.Module:
    return ast.parse(_module_file(module).read_text())


def _constant(module: str, name: str, depth: int = 0) -> Any:
    """A module-level literal (`X = "..."`), following `from eyas.m import X` through light modules."""
    if depth > 4:
        raise _Unresolved(name)
    for node in _tree(module).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if (
            isinstance(node, ast.AnnAssign) and node.value is not None) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):   # `X = ...` or `X: T = ...`
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return _type_alias(node.value, module, depth)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                if (a.asname or a.name) == name:
                    return _constant(node.module, a.name, depth + 1)
    raise _Unresolved(f"{module}.{name}")


def _type_alias(node: ast.expr, module: str, depth: int = 0) -> Any:
    """A shared field type (eyas.flags.Target, eyas.devices.Dtype, ...): Literal[...] as written; Annotated[T, ...]
    as T with its Field(...) (the help text; validators do not change the flags); builtin scalars, Path, None,
    `A | B`, list[...] and names of other such types."""
    import typing
    from pathlib import Path as _Path

    from pydantic import Field

    if isinstance(node, ast.Name) and node.id in ("int", "float", "str", "bool"):
        return getattr(builtins, node.id)
    if isinstance(node, ast.Name) and node.id == "Path":
        return _Path
    if isinstance(node, ast.Name):
        return _constant(module, node.id, depth + 1)
    if isinstance(node, ast.Constant) and node.value is None:
        return type(None)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _type_alias(node.left, module, depth) | _type_alias(node.right, module, depth)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        try:
            if node.value.id == "Literal":
                return typing.Literal[tuple(ast.literal_eval(a) for a in args)]
        except ValueError:
            raise _Unresolved(f"{module}: {ast.unparse(node)}") from None
        if node.value.id == "Annotated":
            fields = [a for a in args[1:] if isinstance(a, ast.Call) and ast.unparse(a.func) == "Field"]
            base = _type_alias(args[0], module, depth)
            if not fields:
                return base
            kw = {k.arg: _value(k.value, module, depth) for k in fields[0].keywords}
            return typing.Annotated[base, Field(*[_value(a, module, depth) for a in fields[0].args], **kw)]
        if node.value.id == "list" and len(args) == 1:
            return list[_type_alias(args[0], module, depth)]
    raise _Unresolved(f"{module}: {ast.unparse(node)}")


def _value(node: ast.expr, module: str, depth: int) -> Any:
    """A Field(...) argument: a literal, a module-level constant, or a `+` of those."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left, module, depth) + _value(node.right, module, depth)
    if isinstance(node, ast.Name):
        return _constant(module, node.id, depth + 1)
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _Unresolved(f"{module}: {ast.unparse(node)}") from None


def light_config(module: str, cls_name: str):
    """The config class `module.cls_name`, built from source; raises _Unresolved when it cannot be."""
    from pathlib import Path as _Path
    import typing

    from pydantic import Field

    from eyas.config import StageConfig

    body = _tree(module).body
    node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if node is None:  # a command module re-exporting its stage's config (`from eyas.data.x import XConfig`)
        for n in body:
            if isinstance(n, ast.ImportFrom) and n.level == 0 and any(a.name == cls_name and a.asname is None
                                                                     for a in n.names):
                return light_config(n.module, cls_name)
    if node is None or [ast.unparse(b) for b in node.bases] != ["StageConfig"]:
        raise _Unresolved(f"{module}.{cls_name}")
    node.body = [b for b in node.body if not isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))] or [ast.Pass()]
    node.decorator_list = []
    ns: dict[str, Any] = {"Field": Field, "Path": _Path, "StageConfig": StageConfig,
                          **{t: getattr(typing, t) for t in _TYPING}}
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    used -= set(ns) | set(dir(builtins))
    for name in used:
        ns[name] = _constant(module, name)
    code = compile(ast.Module(body=[node], type_ignores=[]), str(_module_file(module)), "exec", dont_inherit=True)
    # Annotations are evaluated eagerly here (no `from __future__ import annotations`), with the names above.
    exec(code, ns)  # noqa: S102 - eyas's own source, the class statement only
    cls = ns[cls_name]
    cls.__module__ = module
    return cls


def config_class(module: str, cls_name: str, *, light: bool):
    """The class for a command: from source when `light` (help only), else by importing its module."""
    if light:
        try:
            return light_config(module, cls_name)
        except (_Unresolved, SyntaxError, NameError, TypeError, OSError):
            pass
    import importlib

    return getattr(importlib.import_module(module), cls_name)

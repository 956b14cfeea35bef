"""Record the signatures of eyas's engine entry points from the engine's *source* (no import, no install).

    python -m eyas.engines.signatures.record SRC_ROOT --version 0.32.0 [--engine vllm|sglang] [--out DIR]

SRC_ROOT is an unpacked release (vLLM: the PyPI sdist or a checkout of the tag, containing `vllm/`; SGLang: its
unpacked wheel, containing `sglang/`). The output, `ENGINE-VERSION.json`, has the same shape probe_worker.py
reports from a live env, so eyas.engines.entry_points.check_signatures judges both the same way. Functions give
their parameters (the implementation, not `@overload` stubs; classmethods drop `cls` as inspect does); classes
give their `__init__` or, for dataclass / msgspec / pydantic config classes, their annotated fields (bases
defined in the same file first); `X = Literal[...]` aliases give their members, following aliases in the same file;
"attrs" entries give a class's attribute names (methods, class fields, `self.X = ...` targets).
"""

from __future__ import annotations

import argparse
import re
import ast
import json
import sys
from pathlib import Path

from eyas.engines.adapters import ADAPTERS
from eyas.engines.entry_points import SIGNATURES_DIR, EntryPoint


class SourceTree:
    """Parsed files of one engine release, each parsed at most once."""

    def __init__(self, root: Path, package: str = "vllm"):
        self.root, self.package = Path(root), package
        if not (self.root / package).is_dir():
            raise FileNotFoundError(f"{root}: no {package}/ package directory (expected an unpacked {package} "
                                    "source)")
        self._cache: dict[Path, ast.Module | None] = {}

    def parse(self, rel: str | Path) -> ast.Module | None:
        path = self.root / rel
        if path not in self._cache:
            try:
                self._cache[path] = ast.parse(path.read_text(encoding="utf-8"), str(path))
            except (OSError, SyntaxError, UnicodeDecodeError):
                self._cache[path] = None
        return self._cache[path]

    def candidates(self, ep: EntryPoint) -> list[str]:
        """The hinted file, the imported module's file, then every other file of the package."""
        mod = ep.module.replace(".", "/")
        first = [ep.source, mod + ".py", mod + "/__init__.py"]
        rest = sorted(str(p.relative_to(self.root)) for p in (self.root / self.package).rglob("*.py"))
        seen, out = set(), []
        for rel in first + rest:
            if rel and rel not in seen and (self.root / rel).is_file():
                seen.add(rel)
                out.append(rel)
        return out


def _decorator_names(node) -> set[str]:
    names = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def _find(body: list[ast.stmt], name: str):
    """The last definition of `name` in a body (later definitions win, as at run time), skipping @overload."""
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            if "overload" not in _decorator_names(node):
                found = node
        elif isinstance(node, ast.ClassDef) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = node
    return found


def function_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_first: bool = False) -> list[list]:
    a = fn.args
    pos = [(x, "POSITIONAL_ONLY") for x in a.posonlyargs] + [(x, "POSITIONAL_OR_KEYWORD") for x in a.args]
    n_def = len(a.defaults)  # defaults belong to the last n positional parameters
    out = [[x.arg, kind, i >= len(pos) - n_def] for i, (x, kind) in enumerate(pos)]
    if a.vararg:
        out.append([a.vararg.arg, "VAR_POSITIONAL", False])
    out += [[x.arg, "KEYWORD_ONLY", d is not None] for x, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append([a.kwarg.arg, "VAR_KEYWORD", False])
    if drop_first or "classmethod" in _decorator_names(fn):
        out = out[1:]
    return out


def _is_classvar(ann: ast.expr) -> bool:
    s = ast.unparse(ann)
    return s.startswith(("ClassVar", "typing.ClassVar", "Final"))


def _init_false(value: ast.expr | None) -> bool:
    return (isinstance(value, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                                 and k.value.value is False for k in value.keywords))


def class_params(cls: ast.ClassDef, module: ast.Module, depth: int = 0) -> list[list]:
    init = _find(cls.body, "__init__")
    if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return function_params(init, drop_first=True)
    fields: list[list] = []
    for base in cls.bases:  # dataclass inheritance: base fields come first
        b = _find(module.body, base.id) if isinstance(base, ast.Name) and depth < 8 else None
        if isinstance(b, ast.ClassDef):
            fields += class_params(b, module, depth + 1)
    kw_only = any(k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value for k in cls.keywords)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if _is_classvar(node.annotation) or _init_false(node.value):
                continue
            fields = [f for f in fields if f[0] != name]
            fields.append([name, "KEYWORD_ONLY" if kw_only else "POSITIONAL_OR_KEYWORD", node.value is not None])
    return fields


def literal_values(expr: ast.expr, module: ast.Module, depth: int = 0) -> list:
    """Members of Literal[...] / unions of aliases, following names defined in the same module."""
    if depth > 8:
        return []
    if isinstance(expr, ast.Constant):
        return [] if expr.value is None else [expr.value]
    if isinstance(expr, ast.Dict):   # a registry table: its keys, as the live probe lists a dict's
        return sorted(str(k.value) for k in expr.keys if isinstance(k, ast.Constant))
    if isinstance(expr, ast.Call) and expr.keywords and not expr.args:   # a table built as SomeDict(key=..., ...)
        return sorted(k.arg for k in expr.keywords if k.arg)
    if isinstance(expr, ast.Subscript):
        inner = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        return [v for e in inner for v in literal_values(e, module, depth + 1)]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return literal_values(expr.left, module, depth + 1) + literal_values(expr.right, module, depth + 1)
    if isinstance(expr, ast.Name):
        node = _find(module.body, expr.id)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            return literal_values(node.value, module, depth + 1)
    return []


def class_attrs(cls: ast.ClassDef, module: ast.Module, depth: int = 0) -> list[str]:
    """Class-body names and `self.X = ...` targets of the class and its bases defined in the same file (the
    live probe also sees bases from other files; eyas's required names live on the class itself)."""
    names: set[str] = set()
    for base in cls.bases:
        b = _find(module.body, base.id) if isinstance(base, ast.Name) and depth < 8 else None
        if isinstance(b, ast.ClassDef):
            names.update(class_attrs(b, module, depth + 1))
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    names.update(n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                 and isinstance(n.value, ast.Name) and n.value.id == "self")
    return sorted(n for n in names if not (n.startswith("__") and n.endswith("__")))  # as the live probe


def describe(ep: EntryPoint, tree: SourceTree) -> dict:
    parts = ep.qualname.split(".")
    for rel in tree.candidates(ep):
        module = tree.parse(rel)
        if module is None:
            continue
        node, body = None, module.body
        for part in parts:
            node = _find(body, part)
            if node is None:
                break
            body = node.body if isinstance(node, ast.ClassDef) else []
        if node is None:
            continue
        if ep.kind == "attrs":
            if isinstance(node, ast.ClassDef):
                return {"kind": "values", "values": class_attrs(node, module), "file": rel}
            continue
        if ep.kind == "values":
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                return {"kind": "values", "values": literal_values(node.value, module), "file": rel}
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return {"kind": "callable", "params": function_params(node), "file": rel}
        if isinstance(node, ast.ClassDef):
            return {"kind": "callable", "params": class_params(node, module), "file": rel}
    return {"missing": f"{ep.qualname} is not defined anywhere in {tree.package}/ of this release"}


def record(root: Path, version: str, engine: str = "vllm", entry_points=None) -> dict:
    adapter = ADAPTERS[engine]
    tree = SourceTree(root, adapter.module)
    where = "PyPI sdist / git tag" if engine == "vllm" else "PyPI wheel"
    return {"engine": engine, "version": version, "source": f"{adapter.label} {version} source ({where})",
            "signatures": {ep.name: describe(ep, tree) for ep in (entry_points or adapter.entry_points)}}


def dumps(doc: dict) -> str:
    """JSON with one parameter per line: small diffs between releases, readable in review."""
    text = json.dumps(doc, indent=1)
    # json's indent puts each list item on its own line; fold the innermost [name, kind, default] triples.
    return re.sub(r"\[\s*(\"[^\"]*\"),\s*(\"[A-Z_]+\"),\s*(true|false)\s*\]", r"[\1, \2, \3]", text) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="unpacked source root (contains vllm/ or sglang/)")
    ap.add_argument("--version", required=True)
    ap.add_argument("--engine", choices=sorted(ADAPTERS), default="vllm")
    ap.add_argument("--out", type=Path, default=SIGNATURES_DIR)
    args = ap.parse_args(argv)
    doc = record(args.src, args.version, args.engine)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.engine}-{args.version}.json"
    path.write_text(dumps(doc))
    absent = [k for k, v in doc["signatures"].items() if "missing" in v]
    print(f"wrote {path}: {len(doc['signatures'])} entry points, absent: {absent or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

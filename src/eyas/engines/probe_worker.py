"""Runs INSIDE an engine's environment: report the engine version and the signature of each entry point.

Usage: python probe_worker.py IN.json OUT.json, where IN is {"engine": "vllm", "distributions": [...],
"import": true, "entry_points": [{"name", "module", "qualname", "kind"}]}. Only the standard library and the
engine are imported (eyas is not installed there), and nothing is instantiated: imports and `inspect.signature`
only, so no model and no device is touched.
The judgement (is this signature what eyas needs?) happens in eyas (`eyas.engines.vllm.check_signatures`), so
the same code judges these live signatures and the ones recorded from vLLM's source at release tags.

Output: {"version", "python", "import_s", "signatures": {name: {"kind": "callable", "params": [[name, kind,
has_default], ...]} | {"kind": "values", "values": [...]} | {"missing": "why"}}}. Kind "attrs" reports a
class's attribute names (as "values"): what a subclass of an engine class relies on.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import json
import os
import sys
import textwrap
import time
import typing


def params_of(obj) -> list[list]:
    """[[name, kind, has_default]] in order; kinds are inspect.Parameter kind names."""
    sig = inspect.signature(obj)
    return [[p.name, p.kind.name, p.default is not inspect.Parameter.empty] for p in sig.parameters.values()]


def literal_values(tp) -> list:
    """Flatten a (possibly nested / Optional) typing.Literal alias into its member values."""
    out: list = []
    for a in typing.get_args(tp):
        if typing.get_origin(a) is typing.Literal or typing.get_args(a):
            out.extend(literal_values(a))
        elif a is not type(None):
            out.append(a)
    return out


def class_attrs(cls) -> list[str]:
    """Names a subclass may rely on: class-body names and `self.X = ...` targets of every class in the MRO
    (read from the source: instance attributes exist only once constructed, and the probe constructs nothing)."""
    names: set[str] = set()
    for c in inspect.getmro(cls):
        if c is object:
            continue
        names.update(n for n in vars(c) if not (n.startswith("__") and n.endswith("__")))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(c)))
        except (OSError, TypeError, SyntaxError):
            continue
        names.update(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                     and isinstance(n.value, ast.Name) and n.value.id == "self")
    return sorted(names)


def resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        # getattr_static would miss lazily exported names (vllm/__init__ uses __getattr__); getattr is fine:
        # every object on these paths is a module, class, function or type alias.
        obj = getattr(obj, part)
    return obj


def describe(ep: dict) -> dict:
    try:
        obj = resolve(ep["module"], ep["qualname"])
    except Exception as e:  # an absent module or attribute is exactly what the probe reports
        return {"missing": f"{type(e).__name__}: {e}"}
    try:
        if ep.get("kind") == "attrs":
            return {"kind": "values", "values": class_attrs(obj)}
        if ep.get("kind") == "values":
            if isinstance(obj, dict):
                return {"kind": "values", "values": sorted(map(str, obj))}
            return {"kind": "values", "values": literal_values(obj)}
        return {"kind": "callable", "params": params_of(obj)}
    except (TypeError, ValueError) as e:
        return {"missing": f"no signature: {type(e).__name__}: {e}"}


def engine_version(dist_names: list[str], module: str) -> str | None:
    for d in dist_names:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except Exception:
        return None


def _unshadow() -> None:
    """Python puts this script's directory first on sys.path, and eyas's adapters there are named like the
    engines (engines/vllm.py): drop it so `import vllm` finds the engine, not eyas's adapter."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def main(inp: str, out: str) -> int:
    _unshadow()
    req = json.loads(open(inp).read())
    t0 = time.perf_counter()
    import_error = None
    try:
        if req.get("import", True):  # version-only requests read package metadata and skip the slow import
            importlib.import_module(req["engine"])
    except Exception as e:
        import_error = f"{type(e).__name__}: {e}"
    import_s = time.perf_counter() - t0
    sigs = {ep["name"]: describe(ep) for ep in req["entry_points"]} if import_error is None else {}
    res = {"version": engine_version(req.get("distributions", []), req["engine"]), "python": sys.version.split()[0],
           "import_s": round(import_s, 3), "probe_s": round(time.perf_counter() - t0, 3),
           "import_error": import_error, "signatures": sigs}
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""Structure: no import circles inside eyas, no private names imported across packages, no module over 500 lines,
the library never imports the commands that compose it, and `eyas --help` starts without torch. Read with ast,
nothing imported."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "eyas"


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _imports(path: Path):
    """(imported module, names) for every `import` / `from ... import` anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (MODULES.get(module) and MODULES[module].name == "__init__.py") \
        else parts[0]


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for mod, names in _imports(path):
            for t in [mod] + [f"{mod}.{n}" for n in names]:
                if t in MODULES and t != m and not t.startswith(m + "."):   # a package's __init__ re-exports
                    g[m].add(t)
    return g


def test_no_import_circles():
    g = _graph()
    circles = []
    for start in g:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in g[node]:
                if nxt == start:
                    circles.append(" -> ".join(path + [start]))
                elif nxt not in seen and not start.startswith(nxt + "."):
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not circles, "import circles:\n" + "\n".join(sorted(set(circles)))


def _node(module: str) -> str:
    """The package a module belongs to (eyas.data.x -> eyas.data); a top-level module is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_circles_between_packages():
    """Module circles are not enough: eyas.data.regenerate -> eyas.engines.vllm_generate -> eyas.data.backends is
    no module circle but makes eyas.data and eyas.engines need each other. Every import counts, lazy ones too."""
    edges: dict[str, dict[str, str]] = {}
    for m, targets in _graph().items():
        for t in targets:
            if _node(m) != _node(t):
                edges.setdefault(_node(m), {}).setdefault(_node(t), f"{m} -> {t}")

    def path(a: str, b: str) -> list[str] | None:
        """The import edges of a shortest way from package a to package b, or None."""
        prev, todo = {a: None}, [a]
        while todo:
            n = todo.pop(0)
            for nxt in edges.get(n, {}):
                if nxt not in prev:
                    prev[nxt], todo = n, todo + [nxt]
        if b not in prev:
            return None
        way = [b]
        while prev[way[-1]] is not None:
            way.append(prev[way[-1]])
        return [edges[x][y] for x, y in zip(way[::-1], way[::-1][1:])]

    circles = sorted({" ; ".join(sorted([why] + back))
                      for a in edges for b, why in edges[a].items() if (back := path(b, a)) is not None})
    assert not circles, "packages that import each other:\n" + "\n".join(circles)


def test_no_private_names_across_packages():
    bad = []
    files = {m: p for m, p in MODULES.items()}
    files.update({f"{d}.{p.stem}": p for d in ("bench", "lab") for p in (ROOT / d).glob("*.py")})
    for m, path in files.items():
        for mod, names in _imports(path):
            if not mod.startswith("eyas"):
                continue
            for n in names:
                private = n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
                if private and _package(mod) != _package(m):
                    bad.append(f"{path.relative_to(ROOT)}: from {mod} import {n}")
    assert not bad, "private names imported across packages (make them public or move the caller):\n" + "\n".join(bad)


def test_the_library_never_imports_the_commands():
    """cli, demo and the command modules compose the stages; no stage module reaches back into them."""
    commands = {"eyas.cli", "eyas.demo"}
    bad = [f"{m} imports {t}" for m, ts in _graph().items() for t in ts if t in commands and m not in commands]
    assert not bad, bad


def test_the_vllm_backend_and_the_store_do_not_import_each_other_at_module_level():
    g = _graph()
    assert "eyas.engines.vllm_extract" not in g["eyas.store.extract"]
    assert "eyas.extract" not in g["eyas.engines.vllm_extract"] and "eyas.extract" not in g["eyas.store.extract"]


def test_help_starts_without_torch():
    code = "import sys; from eyas.cli import main; main(['--help']); assert 'torch' not in sys.modules, 'torch'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_each_class_name_means_one_thing():
    """Two `Plan`s or two `ShardWriter`s in one code base make every reader check which one is meant."""
    where: dict[str, list[str]] = {}
    for m, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(m)
    assert not {k: v for k, v in where.items() if len(v) > 1}


def test_test_files_have_unique_basenames():
    """The test dirs are not packages (pytest's prepend import mode), so two test_x.py in different dirs
    stop collection of the whole suite: a mirrored name needs a qualifier (tests/train/test_ttt_masks.py)."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for f in tests.rglob("test_*.py"):
        seen.setdefault(f.name, []).append(str(f.relative_to(tests)))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_the_package_and_the_user_docs_never_refer_to_the_lab():
    """lab/ is the tooling of one remote GPU (carry parts, lanes, deadlines): nothing a user installs or reads
    depends on it."""
    import re

    files = [p for p in SRC.rglob("*") if p.suffix in (".py", ".md", ".yaml", ".txt")]
    files += [ROOT / "README.md", ROOT / "pyproject.toml"]
    bad = [str(p.relative_to(ROOT)) for p in files if re.search(r"(?<![\w.])lab/", p.read_text())]
    assert not bad, bad


def test_every_module_stays_under_500_lines():
    # one module per concern: a module past this has become two (split it by concern, as doctor/ and decode/)
    long = {str(p.relative_to(SRC)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long

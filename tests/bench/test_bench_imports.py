"""Every `from eyas... import name` in the benchmark and lab scripts names something eyas has, also the imports
inside functions, which only run on the GPU (a renamed module once failed the H200's first timed job)."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("lab/*.py"), *ROOT.glob("scripts/*.py")])


def eyas_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "eyas" and not node.level:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "eyas":
                    yield node.lineno, a.name, []


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_imports_exist(path):
    missing = []
    for line, module, names in eyas_imports(path):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            missing.append(f"{path.name}:{line}: {module} ({e})")
            continue
        missing += [f"{path.name}:{line}: {module}.{n}" for n in names
                    if n != "*" and not hasattr(mod, n) and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not missing, "\n".join(missing)

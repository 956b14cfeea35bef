"""Recipe files: a YAML naming a plan (the steps, in Python or listed in the file) and the parameters it runs with.

    description: what the recipe makes and what it costs
    plan: best-draft              # eyas.recipes.PLANS: best-draft, scaling, drafters, demo, steps
    extends: best-draft           # optional: a built-in recipe (or a file) whose params this file changes
    params: {target: smollm2-135m, epochs: 3.0, ...}
    help: {target: "the target model", ...}     # optional, shown by `eyas run RECIPE --show`
    steps: [...]                  # plan steps only: eyas commands, see eyas.recipes.steps

A recipe's params are its whole vocabulary: `--set KEY=VALUE` (or a file extending it) may change a value, never
add a key, and a value takes the type of the one it replaces (an error names the key). A plan with a config class
(`CONFIG`, the demo's DemoConfig) takes that class's fields instead, validated by it.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RECIPES = Path(__file__).resolve().parent / "files"
# plan name -> the module that runs it (imported only when a recipe of that plan is loaded)
PLANS = {"steps": "eyas.recipes.steps", "best-draft": "eyas.recipes.best_draft", "scaling": "eyas.recipes.scaling",
         "drafters": "eyas.recipes.drafters", "demo": "eyas.demo"}
KEYS = ("description", "plan", "extends", "params", "help", "steps")


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and key."""


@dataclass
class Recipe:
    name: str
    plan: str
    params: dict[str, Any]
    description: str = ""
    help: dict[str, str] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)
    source: str = ""          # the file (or files, extends first) it was read from

    def module(self):
        return importlib.import_module(PLANS[self.plan])


def builtin_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(RECIPES.glob("*.yaml"))}


def file_params(name: str) -> dict[str, Any]:
    """A built-in recipe's own params as written (no extends, no validation): for the code that owns their meaning."""
    return dict(_read(name)[2].get("params") or {})


def file_description(name: str) -> str:
    """A built-in recipe's description as written, without importing its plan."""
    return str(_read(name)[2].get("description") or "")


def _read(spec: str | Path) -> tuple[str, Path, dict]:
    builtin = builtin_recipes()
    path = builtin.get(str(spec)) or Path(spec)
    if not path.is_file():
        near = difflib.get_close_matches(str(spec), builtin, n=1)
        raise RecipeError(f"recipe {spec}: not a built-in recipe ({', '.join(builtin)}) nor a YAML file"
                          + (f"; did you mean {near[0]}?" if near else ""))
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RecipeError(f"{path}: cannot read the recipe: {e}") from None
    if not isinstance(doc, dict):
        raise RecipeError(f"{path}: a recipe is a mapping ({', '.join(KEYS)})")
    for k in doc:
        if k not in KEYS:
            raise RecipeError(f"{path}: unknown key {k!r} (a recipe has {', '.join(KEYS)})")
    for k in ("params", "help"):
        if not isinstance(doc.get(k) or {}, dict):
            raise RecipeError(f"{path}: key {k!r} must be a mapping of names to values")
    name = path.stem if str(spec) not in builtin else str(spec)
    return name, path, doc


def load_recipe(spec: str | Path, sets: list[str] | dict[str, Any] = ()) -> Recipe:
    """A built-in recipe by name, or a YAML file (following `extends`), with `sets` applied: KEY=VALUE strings
    (VALUE read as YAML) or a dict of typed values."""
    chain: list[tuple[Path, dict]] = []
    name = None
    while spec is not None:
        stem, path, doc = _read(spec)
        name = name or stem
        if any(path == p for p, _ in chain):
            raise RecipeError(f"{path}: extends itself (through {', '.join(str(p) for p, _ in chain)})")
        chain.append((path, doc))
        spec = doc.get("extends")
        if spec is not None and str(spec) not in builtin_recipes() and not Path(spec).is_absolute():
            spec = path.parent / spec   # a file extending a file beside it
    chain.reverse()   # the base first, each extending file over it
    plans = [(p, d["plan"]) for p, d in chain if "plan" in d]
    plan = plans[0][1] if plans else None
    for path, other in plans[1:]:
        if other != plan:
            raise RecipeError(f"{path}: plan {other!r}, but it extends a recipe of plan {plan!r}")
    if plan not in PLANS:
        raise RecipeError(f"{chain[-1][0]}: plan {plan!r} is not one of {', '.join(PLANS)}")
    recipe = Recipe(name=name, plan=plan, params={}, source=" < ".join(str(p) for p, _ in chain))
    config = getattr(recipe.module(), "CONFIG", None)
    for i, (path, doc) in enumerate(chain):
        recipe.description = doc.get("description", recipe.description)
        recipe.help.update(doc.get("help") or {})
        recipe.steps = doc.get("steps", recipe.steps)
        for k, v in (doc.get("params") or {}).items():
            if i == 0 or config is not None:
                recipe.params[k] = v
            else:
                _update(recipe.params, k, v, f"{path}: params")
    typed = isinstance(sets, dict)
    for k, v in (sets.items() if typed else map(_pair, sets)):
        v = v if typed else _parse(v)
        if config is None:
            _update(recipe.params, k, v, "--set")
        else:
            recipe.params[k] = v
    if config is not None:
        recipe.params = _validated(config, recipe.params, recipe.source)
    if plan == "steps":
        recipe.module().check_steps(recipe)
    return recipe


def _pair(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise RecipeError(f"--set {s}: give KEY=VALUE")
    k, v = s.split("=", 1)
    return k.strip().replace("-", "_"), v


def _parse(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _update(params: dict[str, Any], key: str, value: Any, where: str) -> None:
    """params[key] = value with the type of the value it replaces; an unknown key names the nearest one."""
    if key not in params:
        near = difflib.get_close_matches(key, list(params), n=1, cutoff=0.6)
        raise RecipeError(f"{where}: unknown parameter {key!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                          + f" (this recipe's: {', '.join(params)})")
    old = params[key]
    params[key] = _coerce(old, value, f"{where}: {key}")


def _coerce(old: Any, value: Any, where: str) -> Any:
    if old is None or value is None:
        return value
    if isinstance(old, (int, float)) and not isinstance(old, bool) and isinstance(value, str):
        try:
            value = float(value)   # YAML reads 2e-3 and 1e6 as strings
        except ValueError:
            pass
    if isinstance(old, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(old, int) and isinstance(value, (int, float)) and float(value).is_integer() \
            and not isinstance(value, bool):
        return int(value)
    elif isinstance(old, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(old, str):
        return value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    elif isinstance(old, list) and isinstance(value, list):
        return value
    raise RecipeError(f"{where}={value!r}: expected {type(old).__name__} like {old!r}")


def _validated(config, params: dict[str, Any], where: str) -> dict[str, Any]:
    from eyas.config import ConfigError, build_config

    for k in params:
        if k not in config.model_fields:
            near = difflib.get_close_matches(k, list(config.model_fields), n=1, cutoff=0.6)
            raise RecipeError(f"{where}: unknown parameter {k!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    try:
        cfg = build_config(config, params)
    except ConfigError as e:
        raise RecipeError(f"{where}: {e}") from None
    return {k: getattr(cfg, k) for k in params}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")


def parse_duration(text: str) -> float:
    """'4h', '90m', '1h30m', '540s' or '540' (seconds) -> seconds."""
    s = str(text).strip().lower().replace(" ", "")
    parts = _DURATION.findall(s)
    if not s or "".join(n + u for n, u in parts) != s or (len(parts) > 1 and not all(u for _, u in parts)):
        raise RecipeError(f"--budget {text}: give a duration such as 4h, 90m, 1h30m or 540s")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)

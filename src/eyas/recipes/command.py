"""`eyas run RECIPE`: one call of a recipe (a built-in name or a YAML file) in its OUT directory.

Repeat the same command to continue: finished steps are kept, a step cut by --budget (or a crash) resumes, and
another recipe in the same OUT is refused unless --fresh. Exit 0 when every step is done, 3 when steps are left.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from eyas.config import StageConfig
from eyas.flags import JsonSwitch
from eyas.recipes import DONE, builtin_recipes, load_recipe, parse_duration, run_recipe
from eyas.recipes.recipe import file_description


class RunConfig(StageConfig):
    recipe: str | None = Field(None, description="a built-in recipe (`eyas run` lists them) or a recipe YAML file; "
                               "also the first argument: eyas run best-draft")
    set: list[str] | None = Field(None, description="recipe parameters as KEY=VALUE (VALUE read as YAML), "
                           "e.g. --set target=./my-model device=cuda; --show lists them")
    budget: str | None = Field(None, description="stop this call after this long (4h, 90m, 1h30m, 540s): a step "
                               "still running is stopped and the next call resumes it (default: no limit)")
    out: Path | None = Field(None, description="the recipe's directory: its steps' outputs, state.json and the "
                             "result; the same --out continues a run (default: runs/RECIPE)")
    fresh: bool = Field(False, description="forget OUT's recorded progress and start over (without it, another "
                        "recipe in OUT is refused)")
    show: bool = Field(False, description="print the recipe with its parameters (after --set) and exit")
    json: JsonSwitch = False


def describe() -> str:
    lines = ["built-in recipes (eyas run NAME --show for their parameters):"]
    for name in builtin_recipes():
        first = (file_description(name).strip().splitlines() or [""])[0]
        lines.append(f"  {name:<12} {first}")
    return "\n".join(lines)


def show(recipe) -> str:
    lines = [f"recipe {recipe.name} (plan {recipe.plan}; {recipe.source})", "", recipe.description.strip(), "",
             "parameters (--set KEY=VALUE):"]
    params, notes = dict(recipe.params), dict(recipe.help)
    config = getattr(recipe.module(), "CONFIG", None)
    for k, f in (config.model_fields.items() if config is not None else ()):   # the plan's whole vocabulary
        if k not in ("out", "json"):
            params.setdefault(k, f.default)
            notes.setdefault(k, f.description or "")
    w = max((len(k) for k in params), default=0)
    for k, v in params.items():
        note = notes.get(k, "")
        lines.append(f"  {k:<{w}}  {json.dumps(v, default=str)}" + (f"    # {note}" if note else ""))
    for s in recipe.steps:
        lines.append(f"  step {s['name']}: eyas {s['run']}")
    return "\n".join(lines)


def run(cfg: RunConfig) -> int:
    if cfg.recipe is None:
        print(describe())
        return 0
    recipe = load_recipe(cfg.recipe, cfg.set or [])
    if cfg.show:
        print(show(recipe))
        return 0
    out = cfg.out or Path("runs") / recipe.name
    budget = parse_duration(cfg.budget) if cfg.budget else None
    code, result = run_recipe(recipe, out, budget, fresh=cfg.fresh)
    if cfg.json:
        print(json.dumps(result, indent=2, default=str))
    elif code == DONE and result.get("files"):
        print("\n".join(f"{k}: {v}" for k, v in result["files"].items()))
    return code

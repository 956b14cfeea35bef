"""Recipes: `eyas run RECIPE` runs a resumable, time-budgeted pipeline of eyas stages.

A recipe file (recipe.py) names a plan and its parameters; the runner (runner.py) keeps each step's done-marker in
OUT/state.json, so a call stopped by its --budget, Ctrl-C or a SIGKILL is continued by the same command. A plan is
a module with `run_plan(runner, recipe) -> dict` (its result, with `left`: the steps still to do), `IDENTITY`
(the params that must not change within one OUT; None: all of them) and optionally `check_params(params)` (bad
values refused before anything is written); eyas.recipes.PLANS lists them.
Shipped recipes (files/*.yaml): demo-cpu, demo-gpu (`eyas demo`'s two profiles), best-draft, scaling, drafters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eyas.recipes.recipe import PLANS, Recipe, RecipeError, builtin_recipes, load_recipe, parse_duration
from eyas.recipes.runner import DONE, LEFT, Runner

__all__ = ["PLANS", "DONE", "LEFT", "Recipe", "RecipeError", "Runner", "builtin_recipes", "identity", "load_recipe",
           "parse_duration", "run_recipe"]


def identity(recipe: Recipe) -> dict[str, Any]:
    """What one OUT must keep: the plan, its steps (plan steps) and the params its IDENTITY names."""
    keys = getattr(recipe.module(), "IDENTITY", None)
    params = recipe.params if keys is None else {k: recipe.params[k] for k in keys}
    return {"plan": recipe.plan, **({"steps": recipe.steps} if recipe.steps else {}), **params}


def run_recipe(recipe: Recipe, out: Path, budget_s: float | None = None, fresh: bool = False) -> tuple[int, dict]:
    """One call of RECIPE in OUT: (DONE or LEFT, the plan's result)."""
    check = getattr(recipe.module(), "check_params", None)
    if check is not None:
        check(recipe.params)
    runner = Runner(out, budget_s, fresh)
    try:
        runner.check_recipe(json.loads(json.dumps(identity(recipe), default=str)))
        result = recipe.module().run_plan(runner, recipe)
        return runner.finish(result.get("left", [])), result
    finally:
        runner.close()

"""Plan `steps`: a recipe that lists its eyas commands, run in order, each once.

    plan: steps
    params: {target: smollm2-135m, device: auto}
    steps:
      - name: prepare
        run: prepare --target {target} --data sharegpt --max-samples 2000 --out {out}/prepared --overwrite
      - name: train
        run: train --target {target} --data {out}/prepared --online --out {out}/run --device {device}
        resume: --resume            # added when the step was cut (budget, crash): the command continues its work
        need: 60                    # start it only with this many seconds of the budget left (default 20)

`{name}` is a parameter (or `out`, the recipe's directory), substituted into each word of the command.
"""

from __future__ import annotations

import shlex
import string

from eyas.recipes.recipe import Recipe, RecipeError

IDENTITY = None   # every parameter, and the steps themselves
STEP_KEYS = ("name", "run", "resume", "need")


def check_steps(recipe: Recipe) -> None:
    """Each step has a unique name and a command whose {placeholders} are parameters (or out)."""
    if not recipe.steps or not isinstance(recipe.steps, list):
        raise RecipeError(f"{recipe.source}: plan steps needs a list `steps` of {{name, run}}")
    names = set()
    for i, s in enumerate(recipe.steps):
        where = f"{recipe.source}: steps[{i}]"
        if not isinstance(s, dict) or not {"name", "run"} <= set(s) or set(s) - set(STEP_KEYS):
            raise RecipeError(f"{where}: a step is a mapping with name and run (and optionally resume, need)")
        if s["name"] in names:
            raise RecipeError(f"{where}: step name {s['name']!r} is used twice")
        names.add(s["name"])
        for part in (s["run"], s.get("resume", "")):
            for _, field, _, _ in string.Formatter().parse(str(part)):
                if field is not None and field != "out" and field not in recipe.params:
                    raise RecipeError(f"{where}: {{{field}}} is not a parameter ({', '.join(recipe.params)}, out)")


def command(step: dict, values: dict) -> list[str]:
    return [w.format_map(values) for w in shlex.split(str(step["run"]))]


def run_plan(r, recipe: Recipe) -> dict:
    values = {**recipe.params, "out": str(r.work)}
    for s in recipe.steps:
        args = command(s, values)
        if r.started(s["name"]) and not r.done(s["name"]) and s.get("resume"):
            args += [w.format_map(values) for w in shlex.split(str(s["resume"]))]
        if not r.eyas(s["name"], *args, need=float(s.get("need", 20))):
            break
    return {"left": [s["name"] for s in recipe.steps if not r.done(s["name"])]}

"""Recipe files: the shipped ones load, --set and extending files change values (typed, never new keys), bad
input is one line naming the file / key, and `eyas run` lists, shows and refuses as the CLI should."""

import json
import re

import pytest

from eyas.cli import main
from eyas.recipes import builtin_recipes, load_recipe, parse_duration
from tests.recipes.tiny import FILES


def test_the_shipped_recipes_load_with_a_description_and_a_plan():
    assert set(builtin_recipes()) == {"best-draft", "scaling", "drafters", "demo-cpu", "demo-gpu"}
    for name in builtin_recipes():
        r = load_recipe(name)
        assert r.description.strip() and r.params and r.plan in ("best-draft", "scaling", "drafters", "demo")


def test_the_gpu_demo_profile_is_its_recipe_file():
    from eyas.demo import GPU_PROFILE

    params = load_recipe("demo-gpu").params
    assert {k: v for k, v in params.items() if k not in ("profile", "device")} == GPU_PROFILE
    assert params["profile"] == "gpu" and load_recipe("demo-cpu").params == {"profile": "cpu", "device": "cpu"}


def test_set_takes_the_type_of_the_value_it_replaces():
    p = load_recipe("best-draft", ["target=./my-model", "epochs=2", "lr=2e-3", "max_samples=1e4",
                                   "eval_compile=true", "eval_categories=writing,coding"]).params
    assert (p["target"], p["epochs"], p["lr"], p["max_samples"], p["eval_compile"]) == ("./my-model", 2.0, 0.002,
                                                                                         10000, True)
    assert p["eval_categories"] == "writing,coding" and isinstance(p["epochs"], float)
    assert load_recipe("scaling", ["sizes=1e6"]).params["sizes"] == "1e6"


@pytest.mark.parametrize("sets, msg", [
    (["epoch=3"], r"--set: unknown parameter 'epoch'; did you mean 'epochs'\?"),
    (["epochs=abc"], r"--set: epochs='abc': expected float like 3.0"),
    (["max_samples=1.5"], r"--set: max_samples=1.5: expected int like 9000"),
    (["eval_compile=maybe"], r"eval_compile=.maybe.: give true, false or null"),
    (["nokey"], r"--set nokey: give KEY=VALUE"),
])
def test_a_bad_set_names_the_key(sets, msg, tmp_path):
    from eyas.recipes import run_recipe

    with pytest.raises(ValueError, match=msg):
        run_recipe(load_recipe("best-draft", sets), tmp_path / "out")
    assert not (tmp_path / "out").exists()   # refused before anything is written


def test_demo_recipes_take_the_demo_s_flags_validated_by_its_config():
    assert load_recipe("demo-cpu", ["max_samples=40"]).params["max_samples"] == 40
    with pytest.raises(ValueError, match="unknown parameter 'max_sample'; did you mean 'max_samples'"):
        load_recipe("demo-cpu", ["max_sample=40"])
    with pytest.raises(ValueError, match="--max-samples"):
        load_recipe("demo-cpu", ["max_samples=2"])   # ge=8


def test_a_file_extends_a_recipe_changing_values_never_adding_keys(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: best-draft\nparams:\n  epochs: 2\n  kinds: self\n")
    r = load_recipe(mine, ["lr=3e-4"])
    assert (r.name, r.plan, r.params["epochs"], r.params["kinds"], r.params["lr"]) == ("mine", "best-draft", 2.0,
                                                                                      "self", 3e-4)
    assert r.description == load_recipe("best-draft").description and "best-draft.yaml < " in r.source
    tiny = load_recipe(FILES / "best-draft-tiny.yaml")   # the tests' own, extending the shipped one
    assert tiny.params["draft_vocab_size"] == 512 and tiny.params["target"] == "smollm2-135m"
    (tmp_path / "bad.yaml").write_text("extends: best-draft\nparams:\n  epoch: 2\n")
    with pytest.raises(ValueError, match=r"bad.yaml: params: unknown parameter 'epoch'"):
        load_recipe(tmp_path / "bad.yaml")
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ValueError, match="extends itself"):
        load_recipe(tmp_path / "loop.yaml")
    (tmp_path / "odd.yaml").write_text("plan: best-draft\nparms: {}\n")
    with pytest.raises(ValueError, match=r"odd.yaml: unknown key 'parms'"):
        load_recipe(tmp_path / "odd.yaml")
    (tmp_path / "replan.yaml").write_text("extends: best-draft\nplan: scaling\n")
    with pytest.raises(ValueError, match="plan 'scaling', but it extends a recipe of plan 'best-draft'"):
        load_recipe(tmp_path / "replan.yaml")
    (tmp_path / "noplan.yaml").write_text("plan: fastest\nparams: {}\n")
    with pytest.raises(ValueError, match="plan 'fastest' is not one of"):
        load_recipe(tmp_path / "noplan.yaml")


def test_a_steps_recipe_names_only_its_parameters(tmp_path):
    doc = {"plan": "steps", "params": {"target": "t"}, "steps": [{"name": "a", "run": "prepare --target {taget}"}]}
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"steps\[0\]: \{taget\} is not a parameter"):
        load_recipe(tmp_path / "s.yaml")
    doc["steps"] = [{"name": "a", "run": "x"}, {"name": "a", "run": "y"}]
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="step name 'a' is used twice"):
        load_recipe(tmp_path / "s.yaml")


def test_durations():
    assert [parse_duration(x) for x in ("4h", "90m", "1h30m", "540s", "540", "1.5h")] == \
        [14400, 5400, 5400, 540, 540, 5400]
    for bad in ("", "4 hours", "h", "30m4"):
        with pytest.raises(ValueError, match="--budget"):
            parse_duration(bad)


def test_the_command_lists_shows_and_refuses(tmp_path, capsys):
    assert main(["run"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {n} " in listed for n in builtin_recipes())
    assert main(["run", "demo-cpu", "--show"]) == 0   # a plan with a config class: all of its fields
    assert re.search(r"\n  epochs +4\.0 +# training epochs", capsys.readouterr().out)
    assert main(["run", "best-draft", "--show", "--set", "epochs=2", "kinds=self"]) == 0
    shown = capsys.readouterr().out
    assert "plan best-draft" in shown and re.search(r"\n  epochs +2\.0\n", shown)
    assert re.search(r'\n  kinds +"self" +# data kinds', shown)
    assert main(["run", "best-drat", "--out", str(tmp_path / "o")]) == 1
    assert "did you mean best-draft?" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["run", "best-draft", "--budget", "soon", "--out", str(tmp_path / "o")]) == 1
    assert "--budget soon: give a duration" in capsys.readouterr().err

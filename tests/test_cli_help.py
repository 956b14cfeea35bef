"""What a newcomer meets first: --version, --help with examples, required flags, errors that name the flag."""

import argparse
import json
import subprocess
import sys

import pytest

from eyas import __version__
from eyas.cli import COMMANDS, EXAMPLES, main
from eyas.cli_help import light_config
from eyas.config import add_config_args


@pytest.mark.parametrize("argv", [["--version"], ["-V"]])
def test_version_flag(argv, capsys):
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"eyas {__version__}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_from_source_equals_help_from_import(name):
    """--help builds the config class from source (no stage import); its flags must be the real ones."""
    import importlib

    module, cls_name = COMMANDS[name][:2]
    real = getattr(importlib.import_module(module), cls_name)

    def helptext(cls):
        p = argparse.ArgumentParser(prog=f"eyas {name}")
        add_config_args(p, cls)
        return p.format_help()

    assert helptext(light_config(module, cls_name)) == helptext(real)
    assert EXAMPLES[name], f"{name}: --help needs examples"


def test_subcommand_help_imports_no_torch_and_shows_required_and_examples():
    """Every command's --help in one process; torch must still be unimported at the end."""
    cmds = ["train"] + [c for c in COMMANDS if c != "train"]
    proc = subprocess.run([sys.executable, "-c", "import sys\nfrom eyas.cli import main\n"
                           f"for c in {cmds!r}:\n    try:\n        main([c, '--help'])\n"
                           "    except SystemExit:\n        pass\n"
                           "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert out.strip().endswith("NO-TORCH"), out[-300:] + proc.stderr[-2000:]
    assert out.startswith("usage: eyas train --target TARGET --out OUT [--config FILE] [options]")
    assert "required (here or in --config):" in out and "examples:\n  eyas train --target" in out


@pytest.mark.parametrize("name", [n for n, (m, c, _, _) in COMMANDS.items() if "cache_dir" in light_config(m, c).model_fields])
def test_cache_dir_default_is_stated(name, capsys):
    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--cache-dir CACHE_DIR" in text and "$EYAS_CACHE" in text.split("--cache-dir CACHE_DIR", 1)[1][:200]


def test_missing_required_names_the_flag(capsys):
    assert main(["train", "--target", "x"]) == 2
    err = capsys.readouterr().err
    assert "--out is required" in err and "out: Field required" not in err


def test_bad_value_names_the_flag_and_value(capsys):
    assert main(["train", "--target", "x", "--out", "o", "--ttt-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--ttt-steps: Input should be greater than or equal to 1 (got 0)" in err and "ttt_steps:" not in err


def test_yaml_typo_gets_did_you_mean(tmp_path, capsys):
    y = tmp_path / "c.yaml"
    y.write_text("target: x\nout: o\ntt_steps: 3\nttt-steps: 0\n")
    assert main(["train", "--config", str(y)]) == 2
    err = capsys.readouterr().err
    assert f"{y}: unknown key 'tt_steps'; did you mean 'ttt_steps' (--ttt-steps)?" in err
    assert f"{y}: key 'ttt_steps' (flag --ttt-steps): Input should be greater than or equal to 1" in err


def test_flag_typo_gets_did_you_mean(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--target", "x", "--out", "o", "--tt-steps", "3"])
    assert e.value.code == 2
    assert "unknown flag --tt-steps (did you mean --ttt-steps?)" in capsys.readouterr().err


def test_command_typo_gets_did_you_mean(capsys):
    with pytest.raises(SystemExit):
        main(["trian"])
    assert "did you mean 'train'?" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--max-new-tokens", "0"], ["--max-new-tokens", "-5"], ["--per-category", "0"],
                                 ["--chain", "0"], ["--temperature", "-1"], ["--calib", "0"]])
def test_eval_bad_values_exit_nonzero_before_loading(bad, tmp_path, capsys):
    assert main(["eval", "--target", "x", "--draft", str(tmp_path)] + bad) == 2
    assert bad[0] in capsys.readouterr().err


def test_eval_missing_draft_fails_before_the_target_loads(tmp_path, capsys, monkeypatch):
    import importlib

    ev = importlib.import_module("eyas.decode.evaluate")
    monkeypatch.setattr(ev, "load_pair", lambda *a, **k: pytest.fail("the target was loaded"))
    assert main(["eval", "--target", "smollm2-135m", "--draft", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert f"--draft {tmp_path / 'nope'}: no such directory" in err and len(err.strip().splitlines()) == 1


def test_builtin_spec_bench_loads_from_package_data(monkeypatch):
    """No ../shared, no $EYAS_SPEC_BENCH: the 480 questions ship inside the package."""
    from importlib.resources import files

    from eyas.decode.bench import PACKAGED, load_bench, spec_bench_path

    monkeypatch.delenv("EYAS_SPEC_BENCH", raising=False)
    assert spec_bench_path() == PACKAGED and PACKAGED == files("eyas") / "decode" / "spec_bench" / "question.jsonl"
    qs = load_bench("spec-bench")
    assert len(qs) == 480 and len({q["category"] for q in qs}) == 13
    assert "Apache" in (PACKAGED.parent / "NOTICE.md").read_text()


def test_spec_bench_env_override(tmp_path, monkeypatch):
    from eyas.decode.bench import load_bench

    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"question_id": 1, "category": "mine", "turns": ["hi"]}) + "\n")
    monkeypatch.setenv("EYAS_SPEC_BENCH", str(p))
    assert [q["category"] for q in load_bench("spec-bench")] == ["mine"]
    monkeypatch.setenv("EYAS_SPEC_BENCH", str(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"EYAS_SPEC_BENCH.*unset it"):
        load_bench("spec-bench")


def test_cpu_policy_is_passive_and_overridable(monkeypatch):
    from eyas.threads import available_cpus, configure_cpu

    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "EYAS_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    assert configure_cpu() == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(available_cpus())}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert configure_cpu() == {} and __import__("os").environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setenv("EYAS_NUM_THREADS", "1")
    import torch

    before = torch.get_num_threads()
    try:
        assert configure_cpu() == {"OMP_NUM_THREADS": "1"} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cpu_policy_reaches_a_fresh_process():
    """`eyas` sets the policy before torch loads: a child sees PASSIVE and the thread count from --threads."""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    code = ("import os, sys, eyas.cli as c, eyas.threads as t\n"
            "c.main(['--threads', '1', 'version'])\n"
            "t.configure_cpu(1); import torch\n"
            "print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.split()[-2:] == ["PASSIVE", "1"]

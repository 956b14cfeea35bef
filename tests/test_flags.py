"""One flag vocabulary: every command's config class spells a shared concept one way and takes one set of values.

A new command (or field) that says `--limit`, `--samples`, `--batch-tokens`, `--aux-layers`, `bfloat16`, or a
`--json FILE` fails here; the fix is the name in eyas.flags.CONCEPTS and the types in eyas.flags / eyas.devices.
"""

import argparse
import importlib
import typing

import pytest

from eyas import flags
from eyas.cli import COMMANDS
from eyas.config import add_config_args
from eyas.devices import DTYPES
from eyas.flags import CONCEPTS, RETIRED, SHARED, AuxLayerIds, ResultsFile


def _configs():
    for name, (module, cls, _, _) in COMMANDS.items():
        yield name, getattr(importlib.import_module(module), cls)


CONFIGS = dict(_configs())
TYPE_NAMES = {id(v): k for k, v in vars(flags).items() if k[:1].isupper()}


def _literal_values(annotation) -> list:
    vals = []
    for arg in typing.get_args(annotation) or ():
        vals += _literal_values(arg)
    if typing.get_origin(annotation) is typing.Literal:
        vals += list(typing.get_args(annotation))
    return vals


@pytest.mark.parametrize("command", list(CONFIGS))
def test_no_second_spelling_of_a_known_concept(command):
    for field in CONFIGS[command].model_fields:
        if any(field == c or field.endswith("_" + c) for c in CONCEPTS):
            continue                                  # canonical (max_samples, eval_per_category, ...)
        for old, new in RETIRED.items():
            assert field != old and not field.endswith("_" + old), \
                f"eyas {command} --{field.replace('_', '-')}: spell it {new} (eyas.flags.RETIRED)"


@pytest.mark.parametrize("command", list(CONFIGS))
def test_shared_concepts_take_the_shared_values(command):
    for name, field in CONFIGS[command].model_fields.items():
        flag = f"eyas {command} --{name.replace('_', '-')}"
        if name == "dtype" or name.endswith("_dtype"):
            values = _literal_values(field.annotation)
            assert values and set(values) <= set(DTYPES), f"{flag}: {values} outside {DTYPES} (eyas.devices)"
        if name == "json":
            assert field.annotation is bool, f"{flag} must be a switch (write files with --out)"
        if name == "overwrite":
            assert field.annotation is bool and field.default is False, f"{flag}: a switch, off by default"
        if name == "device" or name.endswith("_device"):
            assert field.annotation is str and field.default == "auto", f"{flag}: str, default auto (eyas.devices)"
        if name == "aux_layer_ids":
            assert AuxLayerIds in typing.get_args(field.annotation), f"{flag}: type it eyas.flags.AuxLayerIds"
        if name == "max_samples":
            assert any(getattr(m, "ge", 0) >= 1 for m in field.metadata), f"{flag}: needs ge=1"


@pytest.mark.parametrize("command", list(CONFIGS))
def test_shared_concepts_take_the_shared_type_and_help(command):
    """`target: Target`, `device: Device = "auto"`, ...: values, checks and help text from eyas.flags, once. An optional
    use (`Target | None`) keeps the type's checks and says in its own words what leaving it out means."""
    for name, field in CONFIGS[command].model_fields.items():
        # an optional --out is a results file, except `eyas run`'s: a recipe's directory, defaulting per recipe
        results = name == "out" and field.default is None and command != "run"
        shared = SHARED.get(name) or (ResultsFile if results else None)
        if shared is None:
            continue
        base, info = typing.get_args(shared)[:2]
        flag = f"eyas {command} --{name.replace('_', '-')}"
        if shared in typing.get_args(field.annotation):
            assert field.description, f"{flag}: optional here; its description must say what leaving it out means"
            continue
        assert field.annotation == base and field.description == info.description and \
            field.metadata == info.metadata, f"{flag}: declare it `{name}: eyas.flags.{TYPE_NAMES[id(shared)]}`"


def test_the_vocabulary_is_used():
    """Each concept is spelled its canonical way by at least one command (a stale table fails too)."""
    fields = {f for cls in CONFIGS.values() for f in cls.model_fields}
    assert set(CONCEPTS) <= fields, set(CONCEPTS) - fields


def test_retired_spellings_are_gone_from_the_help(capsys):
    for command, cls in CONFIGS.items():
        parser = argparse.ArgumentParser(prog=f"eyas {command}")
        add_config_args(parser, cls)
        text = parser.format_help()
        for old in ("--limit", "--samples", "--batch-tokens", "--aux-layers ", "bfloat16", "float32", "{keep"):
            assert old not in text, f"eyas {command} --help still says {old}"


def test_every_help_example_parses_with_the_current_flags():
    import shlex

    from eyas.cli import EXAMPLES, POSITIONAL

    for command, lines in EXAMPLES.items():
        parser = argparse.ArgumentParser(prog=f"eyas {command}", exit_on_error=False)
        add_config_args(parser, CONFIGS[command])
        for line in lines:
            argv = shlex.split(line.split(">")[0])[2:]      # drop `eyas COMMAND` and any shell redirection
            if command in POSITIONAL and argv and not argv[0].startswith("-"):   # `eyas run RECIPE ...`
                argv = [f"--{POSITIONAL[command]}", *argv]
            parser.parse_args(argv)                          # an unknown or renamed flag raises here

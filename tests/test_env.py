"""Every `EYAS_*` environment switch is declared once, in eyas.env.SWITCHES, and read through eyas.env.get."""

import re
from pathlib import Path

import pytest

from eyas import env

SRC = Path(__file__).resolve().parents[1] / "src" / "eyas"
NAME = re.compile(r"EYAS_[A-Z0-9_]*")


def _mentions() -> dict[str, list[str]]:
    """switch name -> files under src/ that spell it (help texts included), env.py itself left out."""
    found: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        if f.name == "env.py" and f.parent == SRC:
            continue
        for name in set(NAME.findall(f.read_text())):
            found.setdefault(name, []).append(str(f.relative_to(SRC)))
    return found


def test_every_switch_in_src_is_declared():
    undeclared = {n: files for n, files in _mentions().items() if n not in env.SWITCHES}
    assert not undeclared, f"declare these in eyas.env.SWITCHES (or rename a string that only looks like one): " \
                           f"{undeclared}"


def test_every_declared_switch_is_read_somewhere():
    assert not set(env.SWITCHES) - set(_mentions()), "stale entries in eyas.env.SWITCHES"


def test_switches_are_read_only_through_the_owner():
    raw = re.compile(r"environ(\.get\(|\[)\s*f?[\"']EYAS_")
    bad = [str(f.relative_to(SRC)) for f in SRC.rglob("*.py") if f.name != "env.py" and raw.search(f.read_text())]
    assert not bad, f"read EYAS_* through eyas.env.get: {bad}"


def test_get_gives_the_value_else_the_default(monkeypatch):
    monkeypatch.delenv("EYAS_PROGRESS_INTERVAL", raising=False)
    assert env.get("EYAS_PROGRESS_INTERVAL") == "15"
    monkeypatch.setenv("EYAS_PROGRESS_INTERVAL", "2")
    assert env.get("EYAS_PROGRESS_INTERVAL") == "2"
    with pytest.raises(KeyError, match="EYAS_NOPE: not an eyas switch"):
        env.get("EYAS_NOPE")


def test_changed_names_the_diagnosis_switches_set_off_their_default(monkeypatch):
    for name in [n for n in env.SWITCHES if n.startswith("EYAS_")]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EYAS_GROUPED_STEPS", "1")
    monkeypatch.setenv("EYAS_PREFILL_SDPA", "portable")   # its default: not a change
    monkeypatch.setenv("EYAS_PROGRESS_INTERVAL", "2")     # a user switch: not the decoder's
    assert env.changed() == {"EYAS_GROUPED_STEPS": "1"}


def test_each_switch_says_what_it_does():
    for name, s in env.SWITCHES.items():
        assert s.kind in ("user", "diagnosis", "test") and len(s.what) > 20, name

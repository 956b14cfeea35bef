"""Entry points: each engine object eyas calls, with the parameters it relies on, and the judge of signatures.

An engine adapter (engines/vllm.py, engines/sglang.py) lists its `EntryPoint`s. probe_worker.py reports their
live signatures from the engine's env (imports and `inspect.signature` only); signatures/record.py reads them
from a release's source. `check_signatures` judges both the same way, so API drift between releases is caught
before any weight loads, in a test or by `eyas doctor --engine`. Pure standard library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIGNATURES_DIR = Path(__file__).parent / "signatures"
POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
KEYWORD = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")


@dataclass
class ProbeResult:
    entry_point: str          # e.g. "vllm.LLM.__init__"
    ok: bool
    detail: str               # what was expected / found


@dataclass(frozen=True)
class EntryPoint:
    """One engine object eyas uses. `module`+`qualname` is the import eyas does; `source` is the defining file at
    the tested release (the recorder's first guess when reading the engine's source without importing it)."""
    name: str
    module: str
    qualname: str
    used_by: str                                   # which eyas code calls it (for the fix message)
    source: str = ""
    kind: str = "callable"                         # "callable": a signature; "values": a Literal's members;
                                                   # "attrs": a class's attribute names (eyas subclasses it)
    positional: tuple[str, ...] = ()               # passed positionally, in this order (after self)
    keywords: tuple[str, ...] = ()                 # passed by keyword
    kwargs_into: str | None = None                 # entry point whose parameters a **kwargs is forwarded to
    values: tuple[str, ...] = ()                   # kind == "values": members that must be present
    reads_only: bool = False                       # eyas only reads these fields (never constructs it)
    architectures: tuple[str, ...] = ()            # probed only for targets of these architectures (() = always)
    drafters: tuple[str, ...] = ()                 # probed only when serving these drafter kinds (() = always)


def applicable(entry_points, architectures=(), drafters=()) -> tuple[EntryPoint, ...]:
    """The entry points every caller uses plus those of a target of these architectures and of these drafter
    kinds (eyas.draft.kinds: eagle3, p-eagle, dflash)."""
    archs, kinds = set(architectures or ()), set(drafters or ())
    return tuple(ep for ep in entry_points if (not ep.architectures or archs & set(ep.architectures))
                 and (not ep.drafters or kinds & set(ep.drafters)))


def _check_callable(ep: EntryPoint, params: list[list], sigs: dict[str, dict]) -> list[str]:
    """Problems with one signature, each naming the parameter; [] = eyas's calls still bind."""
    params = [list(p) for p in params]
    if params and params[0][0] in ("self", "cls") and params[0][1] in POSITIONAL:
        params = params[1:]  # unbound method as reached through the class
    by_name = {p[0]: p for p in params}
    var_kw = any(p[1] == "VAR_KEYWORD" for p in params)
    var_pos = any(p[1] == "VAR_POSITIONAL" for p in params)
    problems = []
    pos = [p for p in params if p[1] in POSITIONAL]
    for i, name in enumerate(ep.positional):
        if i < len(pos):
            if pos[i][0] != name:
                problems.append(f"positional parameter {i} is now `{pos[i][0]}` (eyas passes `{name}` there)")
        elif not var_pos:
            problems.append(f"no longer takes positional parameter `{name}` (#{i})")
    forwarded = None
    if ep.kwargs_into:
        fsig = sigs.get(ep.kwargs_into, {})
        forwarded = {p[0] for p in fsig.get("params", [])} if "params" in fsig else None
    for name in ep.keywords:
        p = by_name.get(name)
        if p is not None and p[1] in KEYWORD:
            continue
        if p is None and var_kw and ep.kwargs_into:
            if forwarded is None or name in forwarded:  # unknown forward target: its own entry reports it
                continue
            problems.append(f"no longer accepts `{name}` (neither a parameter nor a field of {ep.kwargs_into})")
        elif p is None and var_kw:
            continue
        elif p is None:
            problems.append(f"no longer accepts keyword `{name}`")
        else:
            problems.append(f"`{name}` is now {p[1].lower()} (eyas passes it by keyword)")
    used = set(ep.positional) | set(ep.keywords)
    for i, p in enumerate([] if ep.reads_only else params):
        if p[1] in ("VAR_POSITIONAL", "VAR_KEYWORD") or p[2] or p[0] in used:
            continue
        if p[1] in POSITIONAL and i < len(ep.positional):
            continue  # bound positionally (its rename is reported above)
        problems.append(f"now requires `{p[0]}`, which eyas does not pass")
    return problems


def check_signatures(sigs: dict[str, dict], entry_points) -> list[ProbeResult]:
    """Judge signatures (live from probe_worker, or recorded from a release's source) against eyas's calls."""
    results = []
    for ep in entry_points:
        sig = sigs.get(ep.name)
        if sig is None or "missing" in sig:
            why = (sig or {}).get("missing", "not reported by the probe")
            results.append(ProbeResult(ep.name, False, f"absent: {why} (used by {ep.used_by})"))
            continue
        if ep.kind in ("values", "attrs"):
            have = set(sig.get("values", []))
            lacking = [v for v in ep.values if v not in have]
            results.append(ProbeResult(ep.name, not lacking,
                                       f"lacks {lacking} (used by {ep.used_by})" if lacking else
                                       f"has {list(ep.values)}"))
            continue
        if "params" not in sig:
            results.append(ProbeResult(ep.name, False, f"is not callable here (used by {ep.used_by})"))
            continue
        problems = _check_callable(ep, sig["params"], sigs)
        results.append(ProbeResult(ep.name, not problems,
                                   "; ".join(problems) + f" (used by {ep.used_by})" if problems else
                                   "accepts " + ", ".join(ep.positional + ep.keywords or ("()",))))
    return results


def version_status(version: str | None, tested: tuple[str, ...], engine: str) -> tuple[str, str]:
    """(pass|warn|fail, detail) for an installed engine version against the versions eyas was tested with."""
    if not version:
        return "fail", f"{engine} is not installed in that environment"
    if version.split("+")[0] in tested:
        return "pass", f"{engine} {version} (tested)"
    return "warn", (f"{engine} {version} is not in eyas's tested matrix {list(tested)}; "
                    f"the entry-point probe below says whether eyas's calls still bind")


def release(version: str) -> tuple[int, ...]:
    """'0.32.0+cpu' -> (0, 32, 0): the numeric release, for "at least" comparisons."""
    nums = []
    for part in version.split("+")[0].split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]   # leading digits: "0rc1" -> "0"
        if not digits:
            break
        nums.append(int(digits))
        if digits != part:
            break
    return tuple(nums)


def drafter_problems(version: str | None, drafters, since: dict[str, tuple[str, str]]) -> list[str]:
    """Drafter kinds whose hand-over changed meaning, not signature, at a release newer than `version`: the probe
    cannot see those, the version can. `since`: kind -> (first release that serves it as eyas exports it, why)."""
    if not version:
        return []
    return [f"{kind}: needs {since[kind][0]} or newer, this is {version}: {since[kind][1]}"
            for kind in drafters or () if kind in since and release(version) < release(since[kind][0])]


def load_recorded(engine: str, version: str) -> dict[str, Any]:
    """Signatures recorded from an engine's source at a release (see eyas.engines.signatures.record)."""
    path = SIGNATURES_DIR / f"{engine}-{version}.json"
    if not path.is_file():
        known = sorted(p.stem.removeprefix(f"{engine}-") for p in SIGNATURES_DIR.glob(f"{engine}-*.json"))
        raise FileNotFoundError(f"{path}: no recorded signatures for {engine} {version} (recorded: {known})")
    return json.loads(path.read_text())

"""The serving engine: its version and every entry point eyas calls, probed in the engine's own env without loading a
model, and aux ids the engine's model cannot capture."""

from __future__ import annotations

import time

from eyas.aux_layers import default_aux_layer_ids
from eyas.doctor.config import Check, DoctorConfig
from eyas.doctor.target import TargetFacts


def check_engine(cfg: DoctorConfig, facts: TargetFacts | None = None, drafter: str = "eagle3") -> list[Check]:
    """The engine's version and every entry point eyas calls, plus those of the target's architecture (a Kimi-K2.5
    target: the wrapper class, its text model, the registries that read its config) and of the drafter kind (P-EAGLE,
    DFlash: the speculators updater, the draft class)."""
    from eyas.engines.adapters import ADAPTERS
    from eyas.engines.base import EngineError

    t0, out, kind = time.perf_counter(), [], ADAPTERS[cfg.engine]
    archs = list(getattr(facts.config, "architectures", None) or []) if facts is not None else []
    try:
        engine = kind(cfg.python, architectures=archs, drafters=(drafter,))
        results = engine.probe()  # one worker run: the version comes with it
        version = engine.version()
    except EngineError as e:
        out.append(Check(f"engine: {kind.name}", "fail", str(e).split("\n")[0], kind.how_to_create.replace("\n", " ")))
        return out
    status, detail = engine.version_status(version)
    out.append(Check(f"engine: {kind.name} version", status, f"{detail} at {engine.python}",
                     f"install a tested version: {', '.join(kind.tested_versions)}"))
    bad = [r for r in results if not r.ok]
    for r in bad:
        out.append(Check(f"engine: {r.entry_point}", "fail", r.detail,
                         f"{kind.label} {version} changed an API eyas calls: install {kind.label} "
                         f"{kind.tested_versions[-1]}, or update the caller and {kind.__module__}.ENTRY_POINTS"))
    for problem in engine.drafter_problems(version):
        out.append(Check(f"engine: drafter {drafter}", "fail", problem,
                         f"install {kind.label} {kind.tested_versions[-1]}"))
    out.append(Check("engine: entry points", "fail" if bad else "pass",
                     f"{len(results) - len(bad)}/{len(results)} {kind.label} entry points bind with eyas's arguments "
                     f"(probed in {time.perf_counter() - t0:.1f}s, no model loaded)"))
    for arch in (a for a in archs if a in kind.served_layers):
        own = [r for r in results if any(arch in ep.architectures for ep in engine.entry_points
                                         if ep.name == r.entry_point)]
        ok = all(r.ok for r in own)
        out.append(Check("engine: target", "pass" if ok else "fail",
                         f"{kind.label} {version} serves {arch} with its decoder layers at {kind.served_layers[arch]}"
                         f" (eyas captures {facts.paths['layers']}) and EAGLE-3 aux states through the wrapper's "
                         f"set_aux_hidden_state_layers" if ok else
                         f"{kind.label} {version} lacks what serving {arch} needs: "
                         + "; ".join(r.entry_point for r in own if not r.ok),
                         "" if ok else f"use {kind.label} {', '.join(kind.tested_versions)}"))
    return out


def check_engine_aux(facts: TargetFacts, ids: list[int], out: list[Check]) -> None:
    """Aux ids the engine's model cannot capture, though they are valid ids (vLLM's DeepSeek-V2/V3 decoder)."""
    from eyas.engines.vllm import aux_layer_id_problems_in_vllm

    problems = aux_layer_id_problems_in_vllm(facts.config, ids)
    if problems:
        out.append(Check("engine: aux layer ids", "fail", "; ".join(problems),
                         f"pick ids from 1, e.g. {default_aux_layer_ids(facts.num_layers)}"))

"""`eyas doctor`: check every hand-over of the pipeline in seconds, before a single weight loads.

The target is built on the meta device from its config alone (a 1T-parameter MoE inside a multimodal wrapper
costs ~2 s), so layer paths, aux ids, sizes, the chat template's loss mask, the dataset, an existing draft or
export, the store's disk and GPU budgets and the engine's API are all checked against the same numbers the
real run will use. Each check is pass / warn / fail / skip; every fail says how to fix it; exit 1 on any fail.

The checks live by concern in target, draft, data, resources and engine; this module runs them in order.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from eyas.doctor.config import Check, DoctorConfig
from eyas.doctor.data import PROBE_CHAT, check_data, check_prepared, check_stops, check_template
from eyas.doctor.draft import DraftFacts, check_draft, check_parallel, read_draft
from eyas.doctor.engine import check_engine, check_engine_aux
from eyas.doctor.resources import check_memory, check_store, draft_parameters, planned_tokens
from eyas.doctor.target import TargetFacts, check_aux, check_target, check_weight_files

__all__ = ["PROBE_CHAT", "Check", "DoctorConfig", "DraftFacts", "TargetFacts", "check_aux", "check_data",
           "check_draft", "check_engine", "check_engine_aux", "check_memory", "check_parallel", "check_prepared",
           "check_stops", "check_store", "check_target", "check_template", "check_weight_files", "diagnose",
           "draft_parameters", "planned_tokens", "read_draft", "render_table", "run"]


def diagnose(cfg: DoctorConfig) -> list[Check]:
    out: list[Check] = []
    engine = None
    facts = check_target(cfg, out)
    draft = None
    if facts is not None:
        draft = read_draft(cfg.draft, out) if cfg.draft else None
        ids = check_aux(cfg, facts, draft.aux_layer_ids if draft else None, out)
        if draft is not None:
            check_draft(draft, ids, facts, out)
            if draft.drafter != "eagle3":
                check_parallel(draft, facts, out)
        if cfg.engine == "vllm":
            check_engine_aux(facts, ids, out)
    if cfg.engine != "none":
        # The probe waits on another process (importing vLLM takes tens of seconds): it runs beside the checks below,
        # and not at all when the target, aux ids or draft already failed, so those fail in seconds.
        if any(c.status == "fail" for c in out):
            out.append(Check(f"engine: {cfg.engine}", "skip", "not probed: fix the failures above first"))
        else:
            pool = ThreadPoolExecutor(max_workers=1)
            engine = pool.submit(check_engine, cfg, facts, draft.drafter if draft else cfg.draft_kind)
            pool.shutdown(wait=False)
    if facts is not None:
        tokenizer = check_template(cfg, facts, out)
        prepared = check_data(cfg, facts, tokenizer, out) if cfg.data else None
        check_store(cfg, facts, ids, prepared, out)
        vd = (draft.draft_vocab_size if draft else None) or (prepared or {}).get("draft_vocab_size") \
            or min(cfg.draft_vocab_size, facts.vocab_size)
        check_memory(cfg, facts, ids, vd, out, draft.drafter if draft else cfg.draft_kind)
    if engine is not None:
        out += engine.result()
    return out


def render_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    mark = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    lines = []
    for c in checks:
        lines.append(f"{mark[c.status]}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("fail", "warn"):
            lines.append(f"{'':4}  {'':<{width}}  fix: {c.fix}")
    n = {s: sum(c.status == s for c in checks) for s in mark}
    lines.append(f"{n['pass']} passed, {n['warn']} warnings, {n['fail']} failed, {n['skip']} skipped")
    return "\n".join(lines)


def run(cfg: DoctorConfig):
    t0 = time.perf_counter()
    checks = diagnose(cfg)
    seconds = round(time.perf_counter() - t0, 2)
    failed = [c.name for c in checks if c.status == "fail"]
    if cfg.json:
        print(json.dumps({"ok": not failed, "failed": failed, "seconds": seconds,
                                        "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render_table(checks) + f" in {seconds:.1f}s")
    return 1 if failed else 0

"""The cost model against this machine: `--tree auto`'s calibration run, which records the acceptance and the
step times that pick a setting, and the check of every measured setting against what the model predicts for it.
Kept apart from the model (costmodel.py): this part decodes, through an evaluation session."""

from __future__ import annotations

from eyas.decode.costmodel import Costs, choose, covers, predict_from
from eyas.decode.tree import TreeSpec

AUTO_PROBE = TreeSpec(total=80, depth=8, topk=10)   # recorded once; every smaller setting is replayed from it


def calibrate(session, costs: Costs, recorded: list) -> dict:
    """Record a large tree and a chain with `session` (an evaluate Session, greedy), then pick by predicted
    speedup. `costs` takes the measured step times; `recorded` the large tree's rounds."""
    for spec in (TreeSpec.chain(3), AUTO_PROBE):
        _, st = session.run(spec, record=True)
        costs.add_run(spec, st)
        if spec == AUTO_PROBE:
            recorded.extend(st.rounds)
    costs.ar_step, costs.ar_prefill = session.ar_step(), session.ar_prefill()
    chosen, preds = choose(recorded, costs)
    return {"chosen": chosen, "predictions": preds}


def predicted_vs_measured(by_spec, results: list[dict], costs: Costs) -> list[dict]:
    """Per measured setting: replayed from its own rounds (checks the time model; τ matches by construction),
    then from every other recorded setting that covers it (a held-out check of the acceptance replay too)."""
    out = []
    for r in results:
        spec = spec_of(r)
        own = [sr for sr in by_spec if sr[0] == spec][:1]
        sources = own + [sr for sr in by_spec if sr[0] != spec and covers(sr[0], spec)]
        for src in sources:
            out.append({"measured_speedup": r["speedup"], "measured_tau": r["tau"], **predict_from([src], spec, costs)})
    return out


def spec_of(result: dict) -> TreeSpec:
    """The decode setting a result dict was measured with."""
    d = result["decode"]
    return TreeSpec(total=d["total"], depth=d["depth"], topk=d["topk"])

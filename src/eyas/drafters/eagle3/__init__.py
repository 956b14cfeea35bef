"""EAGLE-3: one draft layer run once per drafted token (chains and EAGLE-2 trees), trained with training-time
test. Its pieces predate the registry and stay where the pipeline stages keep them: the model in
eyas.draft.model, the objective in eyas.train.ttt, the proposer in eyas.decode.proposer, the export tables in
eyas.export.contract / eyas.export.formats."""

from __future__ import annotations

from eyas.decode.proposer import EagleProposer
from eyas.draft.kinds import Drafter
from eyas.draft.model import DraftConfig, Eagle3Draft
from eyas.export.contract import expected_tensors
from eyas.export.formats import from_speculators, to_speculators
from eyas.train.ttt import TTTUnroll, objective


def ttt_objective(draft, *, steps: int, decay: float, attention: str, compile_loss: bool,
                  anchors: int | None = None) -> TTTUnroll:
    """Every position is a chain start: `anchors` (a parallel kinds' sampling cap) does not apply."""
    return TTTUnroll(draft, steps, decay, attention, compile_loss=compile_loss)


def check(dc: DraftConfig) -> list[str]:
    bad = []
    if dc.num_layers != 1:
        bad.append(f"num_layers: {dc.num_layers}; the eyas EAGLE-3 draft has exactly 1 layer")
    for key in ("parallel_tokens", "mask_token_id"):
        if getattr(dc, key) is not None:
            bad.append(f"{key}: {getattr(dc, key)}; only parallel drafters (p-eagle, dflash) have one")
    return bad


KIND = Drafter(
    name="eagle3", title="EAGLE-3", model=Eagle3Draft, objective=ttt_objective, objective_value=objective,
    default_decay=lambda tokens: 0.8, defaults={}, proposer=EagleProposer, speculators_type="eagle3",
    to_speculators=to_speculators, from_speculators=from_speculators, expected_tensors=expected_tensors,
    to_export=lambda dc, sd: sd, from_export=lambda dc, sd: sd, default_chain=lambda dc: 3, check=check,
    export_sglang=True)

"""P-EAGLE (Parallel EAGLE, arXiv 2602.01469): EAGLE-3's first layer plus Llama layers, drafting every depth in
one forward from a learned mask hidden state and mask token; COD-sampled training; served by vLLM as eagle3 with
parallel_drafting."""

from __future__ import annotations

from eyas.draft.kinds import Drafter, parallel_problems
from eyas.drafters.p_eagle.export import expected_tensors, from_export, from_speculators, to_export, to_speculators
from eyas.drafters.p_eagle.model import PEagleDraft
from eyas.drafters.p_eagle.objective import PEagleObjective
from eyas.drafters.p_eagle.proposer import PEagleProposer
from eyas.train.loss import token_mean_objective


def objective(draft, *, steps: int, decay: float, attention: str, compile_loss: bool, anchors: int | None = None):
    return PEagleObjective(draft, steps, decay, attention, compile_loss=compile_loss, anchors=anchors)


KIND = Drafter(
    name="p-eagle", title="P-EAGLE", model=PEagleDraft, objective=objective, objective_value=token_mean_objective,
    default_decay=lambda tokens: 1.0, defaults={"num_layers": 4, "norm_before_residual": False},
    proposer=PEagleProposer, speculators_type="peagle", to_speculators=to_speculators,
    from_speculators=from_speculators, expected_tensors=expected_tensors, to_export=to_export,
    from_export=from_export, default_chain=lambda dc: dc.parallel_tokens, check=parallel_problems)

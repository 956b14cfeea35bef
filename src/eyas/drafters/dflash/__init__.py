"""DFlash (block diffusion drafting, arXiv 2602.06036): Qwen3-style layers fill a block of mask tokens in one
non-causal pass, reading the target's hidden states as extra keys/values in every layer; trained on blocks at
random anchors with a per-position exponential loss decay; served by vLLM 0.26 as method dflash."""

from __future__ import annotations

from eyas.drafters.dflash.export import expected_tensors, from_speculators, to_speculators
from eyas.drafters.dflash.model import DFlashDraft
from eyas.drafters.dflash.objective import DFlashObjective, recipe_decay
from eyas.drafters.dflash.proposer import DFlashProposer
from eyas.draft.kinds import Drafter, parallel_problems
from eyas.train.loss import token_mean_objective


def objective(draft, *, steps: int, decay: float, attention: str, compile_loss: bool, anchors: int | None = None):
    return DFlashObjective(draft, steps, decay, attention, compile_loss=compile_loss, anchors=anchors)


KIND = Drafter(
    name="dflash", title="DFlash", model=DFlashDraft, objective=objective, objective_value=token_mean_objective,
    default_decay=lambda tokens: recipe_decay(tokens + 1), defaults={"num_layers": 5},
    proposer=DFlashProposer, speculators_type="dflash",
    to_speculators=to_speculators, from_speculators=from_speculators, expected_tensors=expected_tensors,
    to_export=lambda dc, sd: sd, from_export=lambda dc, sd: sd, default_chain=lambda dc: dc.parallel_tokens,
    check=parallel_problems)

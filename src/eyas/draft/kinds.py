"""The drafter registry: a draft config's `kind` names the package (eyas.drafters.<kind>) that provides everything
kind-specific — the model, its training objective, its proposer (decode side), and its export/import tables.

Generic code (train, decode, export, doctor) asks `get_kind(cfg)` and never names a model class; adding a drafter
is one package under eyas.drafters that defines `KIND` plus one line in PACKAGES. Packages are imported by name on
first lookup: they build on train/decode/export, which themselves import this module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from eyas.draft.model import draft_config_from_target
from eyas.flags import DRAFT_KINDS

# kind name (DraftConfig.kind, --draft-kind) -> the package whose module-level KIND describes it
PACKAGES = {"eagle3": "eyas.drafters.eagle3", "p-eagle": "eyas.drafters.p_eagle", "dflash": "eyas.drafters.dflash"}
assert tuple(PACKAGES) == DRAFT_KINDS, "eyas.flags.DRAFT_KINDS and the registry must name the same kinds"


@dataclass(frozen=True)
class Drafter:
    name: str
    title: str                            # how people write it (model cards, messages)
    model: Callable                       # (DraftConfig) -> nn.Module (combine, forward, logits, init_from_target, ...)
    objective: Callable                   # (draft, *, steps, decay, attention, compile_loss, anchors) -> nn.Module whose
    #                                       forward(input_ids, position_ids, loss_mask, aux, probs, in_vocab,
    #                                       target_arg) -> (loss, stats [K, 3] = ce_sum, correct, count)
    objective_value: Callable             # (stats [K, 3], decay) -> the logged objective (what forward minimised)
    default_decay: Callable               # (tokens drafted per position) -> loss weight ratio of token k+1 to k
    defaults: dict                        # DraftConfig fields of the published recipe (num_layers, ...)
    proposer: Callable                    # (draft, TreeSpec, capacity) -> a proposer (eyas.decode.speculative)
    speculators_type: str                 # speculators_model_type of its vLLM export
    to_speculators: Callable              # (dc, chain=, verifier=, verifier_arch=, dtype=) -> config.json
    from_speculators: Callable            # (config, strict=, default_aux=) -> (DraftConfig | None, errors)
    expected_tensors: Callable            # (dc, embed=) -> {eyas key: (shape, dtype kind, why)}
    to_export: Callable                   # (dc, state dict) -> the export's tensors (eyas names)
    from_export: Callable                 # (dc, export tensors in eyas names) -> the model's state dict
    default_chain: Callable               # (DraftConfig) -> speculative tokens an export asks vLLM for
    check: Callable                       # (DraftConfig) -> problems with this kind's fields (each names it)
    export_sglang: bool = False           # whether `eyas export --format sglang` can write this kind


def parallel_problems(dc) -> list[str]:
    """The fields every parallel drafter (one forward drafts several tokens) needs, each message naming it."""
    bad = []
    if dc.num_layers < 1:
        bad.append(f"num_layers: {dc.num_layers}; at least 1")
    if dc.parallel_tokens is None or dc.parallel_tokens < 1:
        bad.append(f"parallel_tokens: {dc.parallel_tokens}; a parallel drafter drafts at least 1 token per forward")
    if dc.mask_token_id is None or not 0 <= dc.mask_token_id < dc.vocab_size:
        bad.append(f"mask_token_id: {dc.mask_token_id}; must be a target-vocab id in [0, {dc.vocab_size})")
    return bad


def get_kind(which: Any) -> Drafter:
    """The Drafter of a name or of anything with a `.kind` (a DraftConfig)."""
    name = which if isinstance(which, str) else getattr(which, "kind", "eagle3")
    if name not in PACKAGES:
        raise ValueError(f"draft kind {name!r} is not known; choose from {', '.join(PACKAGES)}")
    return importlib.import_module(PACKAGES[name]).KIND


def kind_for_speculators_type(model_type: Any) -> Drafter | None:
    """The Drafter whose export carries this speculators_model_type, or None."""
    for name in PACKAGES:
        k = get_kind(name)
        if k.speculators_type == model_type:
            return k
    return None


def draft_config(tcfg, kind: str = "eagle3", **fields) -> Any:
    """A DraftConfig of `kind` for a target's transformers config: the kind's published defaults, then `fields`
    (aux_layer_ids, draft_vocab_size, num_layers, ...; None values keep the default)."""
    k = get_kind(kind)
    chosen = {**k.defaults, **{f: v for f, v in fields.items() if v is not None}}
    shape = {f: chosen.pop(f) for f in ("aux_layer_ids", "draft_vocab_size", "norm_before_residual",
                                        "norm_before_fc", "num_key_value_heads") if f in chosen}
    dc = draft_config_from_target(tcfg, **shape)
    for f, v in chosen.items():
        setattr(dc, f, v)
    dc.kind = k.name
    return dc


def build_draft(cfg) -> Any:
    """A fresh draft of cfg.kind, after the kind's own checks of its fields."""
    kind = get_kind(cfg)
    problems = kind.check(cfg)
    if problems:
        raise ValueError(f"{kind.name} draft config: " + "; ".join(problems))
    return kind.model(cfg)

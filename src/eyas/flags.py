"""One flag vocabulary: the name and the values every command uses for a concept they share.

Each command's config class lives next to its stage; a field for a shared concept takes the name in
CONCEPTS and, for values, the shared types (`AuxLayerIds` here, `Dtype` / `StoreDtype` in eyas.devices).
tests/test_flags.py walks every command's config class and fails on a field spelled as in RETIRED, on a
dtype value outside eyas.devices.DTYPES, on `--json` taking a value, and on aux ids without the owner's check.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator

from eyas.aux_layers import check_aux_layer_ids

CONCEPTS = {
    "max_samples": "use at most this many rows (source conversations, prepared rows, planned rows)",
    "per_category": "benchmark questions per category",
    "token_budget": "tokens per forward batch",
    "aux_layer_ids": "target layers whose residual streams feed the draft (eyas.aux_layers)",
    "draft_vocab_size": "rows of the draft's lm_head (eyas.vocab)",
    "device": "auto | cpu | cuda | cuda:N (eyas.devices.resolve_device)",
    "dtype": "weights / compute dtype of a model: a subset of eyas.devices.DTYPES",
    "store_dtype": "hidden-state store dtype: bf16 | fp8",
    "json": "switch: print the result as JSON instead of a table",
    "out": "where the command writes (a directory, or the results file)",
    "cache_dir": "cache for built-in targets and datasets",
    "draft_kind": "the drafter: eagle3 | p-eagle | dflash (eyas.draft.kinds)",
}

# Spellings that once named one of the concepts above (or would, in a new command): a config field with one
# of these names, alone or as a suffix (eval_limit), fails tests/test_flags.py.
RETIRED = {
    "limit": "max_samples (rows) or per_category (benchmark questions)",
    "samples": "max_samples",
    "num_samples": "max_samples",
    "batch_tokens": "token_budget",
    "aux_layers": "aux_layer_ids",
    "aux_ids": "aux_layer_ids",
    "layer_ids": "aux_layer_ids",
    "vocab_size": "draft_vocab_size (the target's vocabulary is read from the target, never a flag)",
    "torch_dtype": "dtype",
    "output": "out",
    "output_dir": "out",
}


def _checked(ids: list[int] | None) -> list[int] | None:
    return None if ids is None else check_aux_layer_ids(ids, key="--aux-layer-ids")


# Every command's `aux_layer_ids` field: an unsorted / repeated / negative list fails when the config is
# built, before anything loads (range and fc width need the target / draft: checked when their config is read).
AuxLayerIds = Annotated[list[int], AfterValidator(_checked)]


# The drafter kinds (their packages: eyas.draft.kinds.PACKAGES, which must name the same ones).
DRAFT_KINDS = ("eagle3", "p-eagle", "dflash")
DraftKind = Literal["eagle3", "p-eagle", "dflash"]

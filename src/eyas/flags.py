"""One flag vocabulary: the name and the values every command uses for a concept they share.

Each command's config class lives next to its stage; a field for a shared concept takes the name in
CONCEPTS and its type from here (`Target`, `Device`, `CacheDir`, `DraftVocabSize`, `AuxLayerIds`, ...: values,
checks and help text in one place) or from eyas.devices (`Dtype`, `StoreDtype`).
tests/test_flags.py walks every command's config class and fails on a field spelled as in RETIRED, on a
shared concept typed any other way (SHARED), on a dtype value outside eyas.devices.DTYPES, on `--json`
taking a value, and on aux ids without the owner's check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from eyas.aux_layers import check_aux_layer_ids
from eyas.devices import DEVICE_HELP, DTYPE_HELP, Dtype

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
    "overwrite": "switch: replace an --out that is not this command's own resumable work (eyas.outputs)",
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
    "force": "overwrite",
    "clobber": "overwrite",
}


def _checked(ids: list[int] | None) -> list[int] | None:
    return None if ids is None else check_aux_layer_ids(ids, key="--aux-layer-ids")


# Every command's `aux_layer_ids` field: an unsorted / repeated / negative list fails when the config is
# built, before anything loads (range and fc width need the target / draft: checked when their config is read).
AuxLayerIds = Annotated[list[int], AfterValidator(_checked)]


# The shared field types: a config declares a shared concept as `NAME: TYPE = default`, so its values, checks and
# help text come from here, once. A command that makes one optional (`TYPE | None`, where pydantic keeps the
# checks but not the help) states what leaving it out means in its own description.
Target = Annotated[str, Field(description="the target model: HF dir, hub id, .gguf file or built-in name "
                                          "(smollm2-135m)")]
Device = Annotated[str, Field(description=DEVICE_HELP)]                  # default "auto" at every command
ModelDtype = Annotated[Dtype, Field(description=DTYPE_HELP)]             # a model's weights / compute
CacheDir = Annotated[Path | None, Field(description="cache for built-in targets, datasets and engine packages "
                                                    "(default: $EYAS_CACHE, else ~/.cache/eyas)")]
TrustRemoteCode = Annotated[bool, Field(description="allow the target's own modelling and tokenizer code")]
JsonSwitch = Annotated[bool, Field(description="print the result as JSON instead of a table")]
TextOnly = Annotated[bool, Field(description="vLLM engines: the target's text model only (vLLM's "
                                         "language_model_only: every multimodal input off, so start-up skips the "
                                         "encoder's profiling); eyas sends token ids only, so states and tokens "
                                         "are unchanged")]
ResultsFile = Annotated[Path | None, Field(description="also write the result JSON to this file")]
DraftVocabSize = Annotated[int, Field(ge=1, description="draft vocabulary: the N target tokens most frequent in "
                                                        "the data's assistant turns (capped at the target's)")]

# The draft vocabulary a command builds when not told: 32000, the size of published EAGLE-3 drafts (Llama-3's
# 128k vocabulary cut to the tokens that carry ~all assistant text). `prepare` builds it and `doctor` plans for it;
# the demo's cpu profile keeps its own small default (a short CPU run has data for a few thousand tokens).
DRAFT_VOCAB_SIZE = 32000

# concept -> its field type; tests/test_flags.py fails on a config field of that name typed any other way.
SHARED = {"target": Target, "device": Device, "cache_dir": CacheDir, "trust_remote_code": TrustRemoteCode,
          "json": JsonSwitch, "draft_vocab_size": DraftVocabSize, "text_only": TextOnly}

# The drafter kinds (their packages: eyas.draft.kinds.PACKAGES, which must name the same ones).
DRAFT_KINDS = ("eagle3", "p-eagle", "dflash")
DraftKind = Literal["eagle3", "p-eagle", "dflash"]

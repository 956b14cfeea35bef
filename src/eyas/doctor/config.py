"""The doctor's flags (DoctorConfig) and the finding every check appends (Check), shared by the check modules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from eyas.config import StageConfig
from eyas.devices import StoreDtype
from eyas.flags import (DRAFT_VOCAB_SIZE, AuxLayerIds, CacheDir, DraftKind, DraftVocabSize, JsonSwitch, Target,
                        TrustRemoteCode)


@dataclass
class Check:
    name: str
    status: str          # pass | warn | fail | skip
    detail: str
    fix: str = ""


class DoctorConfig(StageConfig):
    target: Target
    data: str | None = Field(None, description="conversations (file or built-in name) or a PREPARED dir")
    draft: Path | None = Field(None, description="an eyas draft/run dir or a vLLM/SGLang export to check "
                                                  "against the target")
    engine: Literal["none", "vllm", "sglang"] = Field("none", description="probe this engine's version and entry "
                                                                          "points")
    python: str | None = Field(None, description="the engine env's python (default $EYAS_VLLM_PYTHON, or "
                                                 "$EYAS_SGLANG_PYTHON for sglang)")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="planned aux layer ids (default: the draft's, "
                                                                "else 2, N//2, N-3)")
    layers_path: str | None = Field(None, description="where you expect the decoder layers (e.g. model.layers)")
    chat_template: Path | None = Field(None, description="Jinja chat template file overriding the tokenizer's")
    mask_rows: int = Field(16, description="conversations of --data rendered to validate the loss mask")
    store: Path | None = Field(None, description="an existing STORE to verify, or where the planned store goes")
    store_dtype: StoreDtype = Field("bf16", description="planned store dtype")
    max_samples: int | None = Field(None, ge=1, description="planned number of samples (rows) to extract")
    tokens: int | None = Field(None, description="planned number of tokens to extract (overrides --max-samples)")
    max_length: int = Field(2048, description="planned tokens per row (for the disk and memory estimates)")
    draft_vocab_size: DraftVocabSize = DRAFT_VOCAB_SIZE         # planned, when no data / draft gives it
    token_budget: int = Field(16384, gt=0, description="planned tokens per extraction batch (extract's --token-budget)")
    ttt_steps: int = Field(7, description="planned training-time-test steps (parallel kinds: tokens per forward)")
    draft_kind: DraftKind = Field("eagle3", description="planned drafter (default: the --draft's own kind, else eagle3)")
    gpu_memory_gib: float | None = Field(None, description="GPU memory per device to plan for (default: the "
                                                           "visible GPUs, if any)")
    gpus: int = Field(1, description="GPUs the target is spread over for extraction / online training")
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False
    json: JsonSwitch = False

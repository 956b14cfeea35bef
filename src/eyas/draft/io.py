"""Draft checkpoints on disk: `config.json` (full provenance) + `model.safetensors`.

A draft directory is what `train` writes (its best/final weights), what `import` produces and what
`eval` / `export` read. Its config's `kind` picks the model class (eyas.draft.kinds); keys are the module's
own state-dict names, for EAGLE-3 also the speculators / vLLM names (fc.weight, layers.0.*, norm.weight,
lm_head.weight, d2t, t2d).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from eyas import __version__
from eyas.aux_layers import aux_layer_id_problems
from eyas.draft.kinds import build_draft, get_kind
from eyas.draft.model import DraftConfig, rope_inv_freq
from eyas.vocab import require_draft_vocab

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "eyas-draft"


def nonfinite_keys(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The floating-point tensors holding a NaN or inf (a diverged run's weights): one owner check for train,
    eval, export, serve-check and doctor."""
    return [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def nonfinite_weights(path: str | os.PathLike) -> list[str]:
    """nonfinite_keys over a directory's safetensors files, one tensor in memory at a time (an embedding can be
    GBs), each as a line naming the key."""
    bad = []
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            bad += [f"{k}: holds NaN or inf values (did its training diverge?)" for k in h.keys()
                    if nonfinite_keys({k: h.get_tensor(k)})]
    return bad


def check_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    bad = nonfinite_keys(tensors)
    if bad:
        raise ValueError(f"{where}: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold NaN or inf values: the "
                         f"draft is unusable (did its training diverge?); train it again, e.g. with a lower --lr")


def target_problems(*, vocab_size, target_hidden_size, aux_layer_ids, target_vocab: int, target_hidden: int,
                    num_layers: int | None) -> list[str]:
    """What makes a draft (its vocabulary, the hidden size its fc reads, its aux layer ids) unusable with a target:
    one owner for eval and doctor."""
    bad = []
    if vocab_size != target_vocab:
        bad.append(f"vocab mismatch: the draft was built for a {vocab_size}-token target vocabulary, the target "
                   f"has {target_vocab}")
    if target_hidden_size != target_hidden:
        bad.append(f"hidden size mismatch: draft expects target hidden {target_hidden_size}, target has "
                   f"{target_hidden}")
    return bad + aux_layer_id_problems(aux_layer_ids, num_layers, key="the draft's aux layer ids")


def save_draft(model: nn.Module, out: str | os.PathLike, meta: dict[str, Any] | None = None,
               dtype: torch.dtype | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
          for k, v in model.state_dict().items()}
    tmp = out / (WEIGHTS_NAME + ".tmp")
    save_file(sd, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS_NAME)
    doc = {"format": FORMAT, "eyas_version": __version__, "draft": model.config.to_dict(), **(meta or {})}
    (out / CONFIG_NAME).write_text(json.dumps(doc, indent=2, default=str))
    return out


def read_draft_meta(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    cfg = path / CONFIG_NAME
    if not cfg.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME}; not an eyas draft directory")
    doc = json.loads(cfg.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{cfg}: format is {doc.get('format')!r}, expected {FORMAT!r} "
                         f"(a vLLM/speculators export? use `eyas import` first)")
    return doc


def read_draft_config(path: str | os.PathLike) -> DraftConfig:
    """The draft's config and vocabulary map, checked by their owners (eyas.aux_layers, eyas.vocab), reading
    no weight but d2t/t2d: callers check a draft before loading anything big."""
    path = Path(path)
    doc = read_draft_meta(path)
    try:
        cfg = DraftConfig.from_dict(doc["draft"])
        problems = get_kind(cfg).check(cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path / CONFIG_NAME}: {e}") from None
    if problems:
        raise ValueError(f"{path / CONFIG_NAME}: " + "; ".join(problems))
    if (path / WEIGHTS_NAME).is_file():
        with safe_open(str(path / WEIGHTS_NAME), framework="pt") as f:
            if {"d2t", "t2d"} <= set(f.keys()):
                require_draft_vocab(f.get_tensor("d2t"), f.get_tensor("t2d"), vocab_size=cfg.vocab_size,
                                    where=str(path / WEIGHTS_NAME))
    return cfg


def load_draft(path: str | os.PathLike, *, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Build on the meta device, then assign the mmap'd tensors (no double allocation)."""
    path = Path(path)
    cfg = read_draft_config(path)
    doc = read_draft_meta(path)
    with torch.device("meta"):
        model = build_draft(cfg)
    sd = load_file(str(path / WEIGHTS_NAME), device=str(device))
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unexpected:
        raise KeyError(f"{path / WEIGHTS_NAME}: missing keys {missing}, unexpected keys {unexpected}")
    for k, v in model.state_dict().items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise ValueError(f"{path / WEIGHTS_NAME}: key {k} has shape {tuple(sd[k].shape)}, config says {tuple(v.shape)}")
    check_finite(sd, str(path / WEIGHTS_NAME))
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    model.load_state_dict(sd, assign=True)
    # Non-persistent buffers are not in the file: rebuild them on the real device.
    model.inv_freq = rope_inv_freq(cfg).to(device)
    model.embed_tokens.weight.requires_grad_(False)
    return model.eval(), doc

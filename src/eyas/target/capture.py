"""Capture aux hidden states with forward hooks on discovered layers (no forward patching).

aux id k = the residual stream entering decoder layer k (vLLM's convention), read by a
pre-hook on layers[k]. The last hidden state is the input of the final norm, i.e. the last
decoder layer's output before the norm, so the target's logits are lm_head(norm(last)).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from eyas.aux_layers import check_aux_layer_ids
from eyas.target.layers import Layout


def _hidden_from(args: tuple, kwargs: dict) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    raise RuntimeError("decoder layer was called without a hidden_states tensor; cannot capture")


@dataclass
class Captured:
    aux_ids: list[int]
    _aux: dict[int, torch.Tensor] = field(default_factory=dict)
    last: torch.Tensor | None = None

    @property
    def aux(self) -> torch.Tensor:
        """[B, T, len(aux_ids), H] in the model's dtype."""
        missing = [k for k in self.aux_ids if k not in self._aux]
        if missing:
            raise RuntimeError(f"aux layers {missing} were not reached during the forward")
        return torch.stack([self._aux[k] for k in self.aux_ids], dim=2)


def _mark(hook):
    hook.eyas_capture = True  # found again by drop_capture_hooks
    return hook


def drop_capture_hooks(model: nn.Module) -> nn.Module:
    """Remove capture's hooks from `model`, a deep copy of a model under capture: deepcopy keeps forward hooks, and
    the copied ones would write the copy's hidden states into the original's Captured. Returns `model`."""
    for m in model.modules():
        for key in [k for k, fn in m._forward_pre_hooks.items() if getattr(fn, "eyas_capture", False)]:
            del m._forward_pre_hooks[key]
            m._forward_pre_hooks_with_kwargs.pop(key, None)
    return model


@contextmanager
def capture(layout: Layout, aux_ids: list[int], *, last: bool = True) -> Iterator[Captured]:
    """Hooks live only inside the `with` block. Tensors are detached views (no copies)."""
    ids = check_aux_layer_ids(list(aux_ids), layout.num_layers)
    out = Captured(aux_ids=ids)
    handles = []

    def pre_hook(k: int):
        def fn(_mod: nn.Module, args: tuple, kwargs: dict):
            out._aux[k] = _hidden_from(args, kwargs).detach()
        return _mark(fn)

    for k in ids:
        handles.append(layout.layers[k].register_forward_pre_hook(pre_hook(k), with_kwargs=True))
    if last:
        def norm_hook(_mod: nn.Module, args: tuple, kwargs: dict):
            out.last = _hidden_from(args, kwargs).detach()
        handles.append(layout.norm.register_forward_pre_hook(_mark(norm_hook), with_kwargs=True))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def packed_position_ids(lengths: list[int], device=None) -> torch.Tensor:
    """Position ids that restart at 0 for each packed document: [1, sum(lengths)]."""
    return torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)


def document_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool mask (True = attend): causal within each document of a packed row.

    A document starts wherever the position id does not continue the previous one, the same rule
    transformers uses to detect packed rows.
    """
    B, T = position_ids.shape
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    doc = torch.cumsum(starts.long(), dim=1)  # [B, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()
    same = doc[:, :, None] == doc[:, None, :]
    return (same & causal)[:, None]


@torch.no_grad()
def target_states(model: nn.Module, layout: Layout, input_ids: torch.Tensor, aux_ids: list[int], *,
                  attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                  logits: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the target once; return (aux [B,T,k,H], last [B,T,H], logits or None).

    Padded batches: pass the 2-D `attention_mask` (left or right padding); position ids are derived
    from it so left-padded rows get the positions an unpadded run would (absolute-position models
    such as GPT-2 depend on that). Packed rows: pass `position_ids` that restart per document and no
    `attention_mask`; transformers then builds document-causal masks itself, per layer type, so
    sliding-window layers (Gemma, Mistral) keep their window inside each document, and flash
    attention runs varlen. Pad a batch of packed rows by appending one more "document" of pad
    tokens with restarting positions. A 4-D mask is passed through untouched.
    """
    if attention_mask is not None and attention_mask.ndim == 2:
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        elif bool(attention_mask.all()):
            # An all-ones mask says nothing, but its presence turns off transformers' packed-row
            # detection: documents would attend to each other. Drop it.
            attention_mask = None
        elif _restarts_inside(position_ids, attention_mask.bool()):
            raise ValueError("packed rows (position ids restarting inside a row) cannot be combined with a "
                             "padding attention_mask: pass no attention_mask and pad a packed row with one more "
                             "document of pad tokens whose positions restart at 0")
    backbone = backbone_of(model, layout)
    if position_ids is not None and attention_mask is None and _uses_mrope(getattr(backbone, "config", None)):
        position_ids = _mrope_packed_positions(position_ids)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    with capture(layout, aux_ids) as cap:
        if logits:
            out = model(**kwargs).logits
        else:
            # Skip the wrapper (vision towers, full-vocab lm_head) when only states are needed.
            backbone(**kwargs)
            out = None
    return cap.aux, cap.last, out


def backbone_of(model: nn.Module, layout: Layout) -> nn.Module:
    path = layout.paths["layers"].rsplit(".", 1)
    return model.get_submodule(path[0]) if len(path) == 2 else model


def _restarts_inside(position_ids: torch.Tensor, valid: torch.Tensor) -> bool:
    """Does a position id fail to continue its predecessor between two valid tokens of a row?"""
    both = valid[:, 1:] & valid[:, :-1]
    return bool((both & (position_ids[:, 1:] != position_ids[:, :-1] + 1)).any())


def _uses_mrope(config) -> bool:
    """Multimodal RoPE (Qwen2-VL family): positions are [3, B, T] (time, height, width) per token."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, key, None)
        if isinstance(rope, dict) and "mrope_section" in rope:
            return True
    return False


def _mrope_packed_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] text positions -> [4, B, T]: mrope models read row 0 as the text positions that drive
    packed-document masking and rows 1..3 as the rotary positions (all equal for text tokens)."""
    if position_ids.ndim != 2:
        return position_ids  # already 3-D/4-D: the caller built multimodal positions itself
    return position_ids[None].expand(4, -1, -1)

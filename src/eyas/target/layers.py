"""Find a causal LM's text decoder by structure, through any wrapper.

The decoder backbone is the module that directly owns the token embedding (the model's
`get_input_embeddings()`) and a ModuleList of identical blocks: `model.model` for Llama-likes,
`model.model.language_model` / `model.language_model` for multimodal wrappers, `transformer`
for GPT-2. The final norm is that backbone's norm child registered after the layer list.
No architecture-name tables, so new architectures work when they follow the common shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn


class LayoutError(LookupError):
    """The text decoder could not be found; the message lists what was searched."""


@dataclass
class Layout:
    layers: nn.ModuleList
    embed: nn.Module
    norm: nn.Module
    lm_head: nn.Module
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.embed.weight.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default: (2, N//2, N-3); aux id k is the residual stream entering layer k."""
    if num_layers < 1:
        raise ValueError(f"a target needs at least one decoder layer, got {num_layers}")
    ids = [2, num_layers // 2, num_layers - 3]
    if ids[0] < ids[1] < ids[2] < num_layers:
        return ids
    # Too shallow for the standard triple (N < 7 repeats, reorders or leaves the range): spread up to three
    # distinct ids evenly over the stack instead (first layer, middle, last).
    return sorted({round(j * (num_layers - 1) / 2) for j in range(3)})


def validate_aux_layer_ids(ids: list[int], num_layers: int) -> list[int]:
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux layer ids {bad} out of range: the target has {num_layers} decoder layers "
                         f"(valid ids 0..{num_layers - 1}; id k = the residual stream entering layer k)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"aux layer ids {ids} repeat an id")
    return ids


def _is_norm(mod: nn.Module) -> bool:
    return "norm" in type(mod).__name__.lower()


def _homogeneous_list(mod: nn.Module) -> bool:
    return isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(m) for m in mod}) == 1


def find_layout(model: nn.Module) -> Layout:
    """Locate decoder layers, token embedding, final norm and lm_head of a causal LM."""
    searched: list[str] = []
    try:
        embed = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embed = None
    lm_head = None
    try:
        lm_head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        pass
    names = {id(m): n for n, m in model.named_modules()}
    if lm_head is None:
        lm_head = getattr(model, "lm_head", None)
    if embed is None or lm_head is None:
        raise LayoutError(
            f"{type(model).__name__}: no token embedding / lm_head found (get_input_embeddings() -> "
            f"{type(embed).__name__ if embed is not None else None}, get_output_embeddings() -> "
            f"{type(lm_head).__name__ if lm_head is not None else None}); is this a causal LM?")

    for name, mod in model.named_modules():
        children = dict(mod.named_children())
        if not any(c is embed for c in children.values()):
            continue
        searched.append(name or "<root>")
        lists = [(n, c) for n, c in children.items() if _homogeneous_list(c)]
        if not lists:
            continue
        # The decoder stack is the longest homogeneous list directly under the embedding's owner.
        list_name, layers = max(lists, key=lambda nc: len(nc[1]))
        order = list(children)
        after = [n for n in order[order.index(list_name) + 1:] if _is_norm(children[n])]
        norms = after or [n for n in order if _is_norm(children[n])]
        if not norms:
            continue
        norm_name = norms[-1]
        prefix = f"{name}." if name else ""
        return Layout(
            layers=layers, embed=embed, norm=children[norm_name], lm_head=lm_head,
            paths={"layers": prefix + list_name, "embed": names.get(id(embed), "?"),
                   "norm": prefix + norm_name, "lm_head": names.get(id(lm_head), "lm_head")})
    raise LayoutError(
        f"{type(model).__name__}: no text decoder found. Searched the modules owning the token embedding "
        f"({names.get(id(embed), '?')}): {searched or 'none'} for a ModuleList of identical layers plus a "
        f"final norm (common shapes: model.layers + model.norm, language_model.layers, transformer.h + ln_f).")

"""Find a causal LM's text decoder by structure, through any wrapper.

The decoder backbone is the module that directly owns the token embedding (the model's
`get_input_embeddings()`) and a ModuleList of identical blocks: `model.model` for Llama-likes,
`model.model.language_model` / `model.language_model` for multimodal wrappers, `transformer`
for GPT-2. The final norm is that backbone's norm child registered after the layer list.
No architecture-name tables, so new architectures work when they follow the common shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
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


def model_class_for(config):
    """The class named in config.architectures when transformers has it; else, for a multimodal wrapper whose
    config no causal-LM auto class takes but whose text_config one does, its text model (target/wrapped.py);
    else AutoModelForCausalLM."""
    import transformers

    from eyas.target.wrapped import WrappedTextLM, is_wrapped_text

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return WrappedTextLM if is_wrapped_text(config) else transformers.AutoModelForCausalLM


def build_meta(config) -> nn.Module:
    """Instantiate the architecture on the meta device: structure and shapes, zero bytes."""
    cls = model_class_for(config)
    with torch.device("meta"):
        if hasattr(cls, "from_config"):
            return cls.from_config(config)
        return cls(config)


def text_config(config):
    """The language model's config: multimodal wrappers keep its numbers in a text sub-config."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _is_norm(mod: nn.Module) -> bool:
    return "norm" in type(mod).__name__.lower()


def _call_getter(model: nn.Module, getter: str) -> nn.Module | None:
    try:
        return getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None


def _token_embedding(model: nn.Module) -> nn.Module | None:
    """get_input_embeddings(), else (plain nn.Modules) the nn.Embedding with the most rows: the token
    table is larger than any position or type table."""
    embed = _call_getter(model, "get_input_embeddings")
    if embed is not None:
        return embed
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    return max(tables, key=lambda m: m.num_embeddings) if tables else None


def _block_list(children: dict[str, nn.Module]) -> str | None:
    """Name of the decoder stack among an owner's children: the longest non-empty ModuleList,
    preferring lists of one block type (hybrid stacks of mixed types still qualify)."""
    lists = [(n, c) for n, c in children.items() if isinstance(c, nn.ModuleList) and len(c) > 0]
    if not lists:
        return None
    return max(lists, key=lambda nc: (len({type(m) for m in nc[1]}) == 1, len(nc[1])))[0]


def find_layout(model: nn.Module) -> Layout:
    """Locate decoder layers, token embedding, final norm and lm_head of a causal LM."""
    embed = _token_embedding(model)
    lm_head = _call_getter(model, "get_output_embeddings")
    if lm_head is None:
        lm_head = getattr(model, "lm_head", None)
    if embed is None or lm_head is None:
        raise LayoutError(
            f"{type(model).__name__}: no token embedding / lm_head found (searched get_input_embeddings(), "
            f"nn.Embedding modules -> {type(embed).__name__ if embed is not None else None}; "
            f"get_output_embeddings(), .lm_head -> {type(lm_head).__name__ if lm_head is not None else None}); "
            f"is this a causal LM?")
    names = {id(m): n for n, m in model.named_modules()}

    # The decoder backbone is the module that owns the token embedding directly: the layer list
    # and the final norm are its siblings in every family we know (and need no name table).
    searched: list[str] = []
    for name, mod in model.named_modules():
        children = dict(mod.named_children())
        if not any(c is embed for c in children.values()):
            continue
        where = name or "<root>"
        list_name = _block_list(children)
        if list_name is None:
            searched.append(f"{where} (no ModuleList among children {list(children)})")
            continue
        order = list(children)
        after = [n for n in order[order.index(list_name) + 1:] if _is_norm(children[n])]
        norms = after or [n for n in order if _is_norm(children[n])]
        if not norms:
            searched.append(f"{where} (layer list {list_name!r} but no *Norm child among {order})")
            continue
        norm_name = norms[-1]  # the final norm is registered after the blocks
        prefix = f"{name}." if name else ""
        return Layout(
            layers=children[list_name], embed=embed, norm=children[norm_name], lm_head=lm_head,
            paths={"layers": prefix + list_name, "embed": names.get(id(embed), "?"),
                   "norm": prefix + norm_name, "lm_head": names.get(id(lm_head), "lm_head")})
    raise LayoutError(
        f"{type(model).__name__}: no text decoder found. Searched every module owning the token embedding "
        f"{names.get(id(embed), '?')!r} for a ModuleList of decoder blocks plus a final norm: "
        f"{'; '.join(searched) or 'none'}. Common shapes: model.layers + model.norm, "
        f"model.language_model.layers (multimodal wrappers), transformer.h + transformer.ln_f.")

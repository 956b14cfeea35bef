"""Owner of a target's special token ids: which ids end generation, which one pads, what bos/eos name.

Every stage that stops generating or pads (native eval and decoder, the hf / native / vLLM regenerate backends,
serve-check's engines) takes them from here, so they all stop on the same tokens. The ids come from the target's
config and its generation_config.json, never from the tokenizer's strings: a tokenizer built from a GGUF by
transformers names other tokens on other versions (5.17 gives SmolLM2's GGUF eos `<|im_start|>`, Qwen2's
`<|endoftext|>`), while the ids the model was trained with are in the config.

Stop ids: generation_config's eos ids (what HF generate stops on) and the config's (what vLLM's tokenizer-side
eos is when the tokenizer is right), the config's first. `align_tokenizer` makes a tokenizer name the ids it is
given (the GGUF converter: the GGUF's own `tokenizer.ggml.*_token_id`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROLES = ("bos", "eos", "pad")


@dataclass(frozen=True)
class SpecialIds:
    stop: tuple[int, ...]      # every id that ends generation, the primary eos first; () = only the length stops
    bos: int | None
    pad: int | None            # the config's pad id, else the primary eos
    where: str = "target"

    @property
    def eos(self) -> int | None:
        return self.stop[0] if self.stop else None

    def required_stop(self) -> list[int]:
        """The stop ids, for a stage that needs answers to end (regenerate): none is an error naming the target."""
        if not self.stop:
            raise ValueError(f"{self.where}: no eos_token_id in its config or generation_config.json; eyas cannot "
                             "tell where an answer ends (add eos_token_id to generation_config.json)")
        return list(self.stop)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _get(source, key: str):
    if source is None:
        return None
    return source.get(key) if isinstance(source, dict) else getattr(source, key, None)


def special_ids(config, generation=None, *, where: str = "target") -> SpecialIds:
    """The ids of `config` (an HF config or its dict; a wrapper's text_config is read where the outer one has
    none) and `generation` (a GenerationConfig, its dict, or None). `where` names the target in errors."""
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    if text is not None and text is not config:
        configs.append(text)

    def first(key: str) -> list[int]:
        return next((ids for c in configs if (ids := _ids(_get(c, key)))), [])

    stop = list(dict.fromkeys(first("eos_token_id") + _ids(_get(generation, "eos_token_id"))))
    bos = (first("bos_token_id") or _ids(_get(generation, "bos_token_id")) or [None])[0]
    pad = (first("pad_token_id") or _ids(_get(generation, "pad_token_id")) or stop or [None])[0]
    return SpecialIds(stop=tuple(stop), bos=bos, pad=pad, where=where)


def generation_dict(path) -> dict | None:
    """The generation_config.json of a model directory (None when there is none, or `path` is no directory)."""
    f = Path(path) / "generation_config.json" if path is not None else None
    if f is None or not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from e


def model_special_ids(model, path=None, *, where: str = "target") -> SpecialIds:
    """A loaded model's ids: its config, and the generation_config.json in `path` (its directory) or else the
    model's own generation_config (eyas's fast load builds that from the config alone)."""
    generation = generation_dict(path)
    if generation is None:
        generation = getattr(model, "generation_config", None)
    return special_ids(getattr(model, "config", None), generation, where=where)


def target_special_ids(target) -> SpecialIds:
    """An `eyas.target.Target`'s ids (its model's config and its directory's generation_config.json)."""
    return model_special_ids(target.model, target.source.path, where=f"target {target.source.name!r}")


def align_tokenizer(tokenizer, ids: dict[str, int | None]):
    """Make `tokenizer` name the tokens of `ids` ({"bos"|"eos"|"pad": id or None}) as its bos/eos/pad token; a
    role already right is left untouched (its saved files stay byte for byte). Returns the tokenizer."""
    for role, i in ids.items():
        want = None if i is None else tokenizer.convert_ids_to_tokens(int(i))
        if i is not None and (want is None or int(i) >= len(tokenizer)):
            raise ValueError(f"{role}_token_id {i}: not a token of the tokenizer ({len(tokenizer)} tokens)")
        have = getattr(tokenizer, f"{role}_token", None)
        if (None if have is None else str(have)) == want:
            continue
        if want is None:
            setattr(tokenizer, f"{role}_token", None)
        else:   # registered as a special token, so the text "<eos string>" encodes to its id, here as once saved
            tokenizer.add_special_tokens({f"{role}_token": want})
    return tokenizer


def tokenizer_roles(tokenizer) -> dict[str, int | None]:
    """What a tokenizer names bos/eos/pad, as ids (for reports and checks)."""
    return {role: getattr(tokenizer, f"{role}_token_id", None) for role in ROLES}

"""The HF config and tokenizer of a GGUF, built from its parsed header (target/gguf_header.py), not re-read.

transformers' own GGUF loaders parse the whole header again for the config and twice more for the tokenizer
(AutoTokenizer reads the config first): tens of seconds for a 150k-token vocabulary. Here:
  config     a table per architecture (GGUF key -> HF config key), the values transformers' loader takes
             (tests/target/test_gguf_meta.py compares the dicts);
  tokenizer  the header's tokens, merges, token types and special ids handed to transformers' own GGUF
             tokenizer converter in the shape its GGUF reader hands them, then the class AutoTokenizer picks
             for the config, built the way its GGUF branch builds it: the saved files are byte for byte those
             of `AutoTokenizer.from_pretrained(dir, gguf_file=...)`.
transformers 5.17 reads the tokenizer's fields through its GGUFReader-based `load_gguf_checkpoint` (slow:
the dicts are rebuilt here from the header with its key table); 5.18 and later have a fast reader of their own,
`integrations.gguf.get_gguf_tokenizer`, which reads only the tokenizer's keys (half a second), and that is
called as is, so its per-version rules stay its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.target.gguf_header import GGUFHeader

# GGUF key (after "<arch>.") -> HF config key: transformers' GGUF config mapping for these architectures
_COMMON = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
CONFIG_KEYS = {"llama": {**_COMMON, "rope.dimension_count": "head_dim"}, "qwen2": _COMMON}
REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
# tokenizer.ggml.<key> -> HF config key
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
             "padding_token_id": "pad_token_id"}


# tokenizer.ggml.<key> -> the tokenizer role it names (target/special.align_tokenizer)
TOKEN_ROLES = {"bos_token_id": "bos", "eos_token_id": "eos", "padding_token_id": "pad"}


def gguf_special_ids(h: GGUFHeader) -> dict[str, int | None]:
    """{"bos"|"eos"|"pad": id} as the GGUF's `tokenizer.ggml.*_token_id` give them (None where it has none): what
    the converted tokenizer names, whatever this transformers' converter picked."""
    return {role: (None if (v := h.metadata.get(f"tokenizer.ggml.{key}")) is None else int(_scalar(h, f"tokenizer.ggml.{key}", v)))
            for key, role in TOKEN_ROLES.items()}


def _head_dim(c: dict) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


# Keys of the architecture its HF config does not hold, and the value each must have: another one would make
# a different model than the one the config describes.
IMPLIED = {
    "attention.key_length": _head_dim,
    "attention.value_length": _head_dim,
    "rope.dimension_count": _head_dim,          # qwen2 (llama maps it): partial rotary has no HF key here
    "expert_count": lambda c: 0,
    "expert_used_count": lambda c: 0,
    "rope.scaling.type": lambda c: "none",
    "rope.scale_linear": lambda c: 1.0,
}
# Keys that say nothing about the weights' meaning (or only matter with a rope scaling type, refused above).
IGNORED = {"tensor_data_layout", "rope.scaling.factor", "rope.scaling.original_context_length",
           "rope.scaling.finetuned", "context_length_train"}


def config_dict(h: GGUFHeader) -> dict[str, Any]:
    """The config dict transformers' GGUF loader builds for this header (llama, qwen2); a key the tables do
    not know, a missing required one or a value that would change the model is an error naming the key."""
    arch = h.arch
    if arch not in CONFIG_KEYS:
        raise ValueError(f"{h.path}: GGUF architecture {arch!r} has no config table (known: {', '.join(CONFIG_KEYS)})")
    table = CONFIG_KEYS[arch]
    missing = [f"{arch}.{k}" for k in REQUIRED if f"{arch}.{k}" not in h.metadata]
    if missing:
        raise ValueError(f"{h.path}: GGUF key {missing[0]} is missing; the HF config needs it as "
                         f"{table[missing[0].split('.', 1)[1]]}")
    c: dict[str, Any] = {"model_type": arch}
    if "general.name" in h.metadata:
        c["_model_name_or_path"] = h.metadata["general.name"]
    implied = {}
    for key, value in h.metadata.items():
        if not key.startswith(arch + "."):
            continue
        sub = key[len(arch) + 1:]
        if sub in table:
            c[table[sub]] = _scalar(h, key, value)
        elif sub in IMPLIED:
            implied[key] = (sub, _scalar(h, key, value))
        elif sub not in IGNORED:
            raise ValueError(f"{h.path}: GGUF key {key!r} (= {value!r}) has no HF config key for a {arch} model in "
                             f"eyas's table (target/gguf_meta.py); converting without it would change the model")
    for key, (sub, value) in implied.items():
        want = IMPLIED[sub](c)
        if value != want:
            raise ValueError(f"{h.path}: GGUF key {key!r} is {value!r}; the HF {arch} config eyas writes can only "
                             f"mean {want!r}, so the converted model would differ")
    for key, hf in TOKEN_IDS.items():
        if f"tokenizer.ggml.{key}" in h.metadata:
            c[hf] = _scalar(h, f"tokenizer.ggml.{key}", h.metadata[f"tokenizer.ggml.{key}"])
    c["tie_word_embeddings"] = all(t.name != "output.weight" for t in h.tensors)
    if "vocab_size" not in c and "tokenizer.ggml.tokens" in h.metadata:
        c["vocab_size"] = len(h.metadata["tokenizer.ggml.tokens"])
    return c


def _scalar(h: GGUFHeader, key: str, value):
    if not isinstance(value, (int, float, str)):
        raise ValueError(f"{h.path}: GGUF key {key!r} holds {type(value).__name__}, a single value is expected")
    return value


def hf_config(h: GGUFHeader):
    """The transformers config object, as `AutoConfig.from_pretrained(dir, gguf_file=...)` returns it."""
    from transformers import AutoConfig

    d = config_dict(h)
    config = AutoConfig.for_model(**d)
    config._name_or_path = str(h.path.parent)
    return config


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v


def legacy_fields(h: GGUFHeader, mapping: dict[str, dict[str, str]]) -> tuple[dict, dict]:
    """`load_gguf_checkpoint`'s tokenizer dicts: `mapping` (group -> {key after "tokenizer.": name}) over every
    tokenizer.* key, values as its reader gives them (lists; a one-element array as its element)."""
    fields: dict[str, dict] = {"tokenizer": {}, "tokenizer_config": {}}
    for key, value in h.metadata.items():
        if not key.startswith("tokenizer."):
            continue
        sub, value = key[len("tokenizer."):], _plain(value)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        for group, renames in mapping.items():
            if sub in renames:
                fields[group][renames[sub]] = value
    return fields["tokenizer"], fields["tokenizer_config"]


def tokenizer_fields(h: GGUFHeader) -> tuple[str, dict, dict, Any]:
    """(architecture, tokenizer dict, tokenizer config, converter) as this transformers' GGUF branch has them."""
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:   # transformers 5.17: its key table and converter, our reading of the fields
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer as legacy

        return (h.arch, *legacy_fields(h, GGUF_TOKENIZER_MAPPING), legacy)
    arch, tokenizer, config = get_gguf_tokenizer(str(h.path))
    return arch, tokenizer, config, convert_gguf_tokenizer


def hf_tokenizer(h: GGUFHeader, config):
    """The tokenizer `AutoTokenizer.from_pretrained(dir, gguf_file=...)` builds, from the parsed header."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    arch, fields, tokenizer_config, convert = tokenizer_fields(h)
    backend, extra = convert(arch, fields)
    kwargs = {**tokenizer_config, **extra}
    # The GGUF branch adds its kwargs after TokenizersBackend has taken add_prefix_space from the caller's: it
    # reaches init_kwargs (saved) but not the tokenizer's behaviour. Passed up front, it would change both.
    late = {k: kwargs.pop(k) for k in ("add_prefix_space",) if k in kwargs}
    cls = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    tokenizer = cls.from_pretrained(str(h.path.parent), gguf_file=h.path.name, tokenizer_object=backend, **kwargs)
    tokenizer.init_kwargs.update(late)
    return tokenizer


def fast_path_problem(h: GGUFHeader) -> str | None:
    """Why the header alone cannot give transformers' config and tokenizer (None when it can)."""
    if h.arch not in CONFIG_KEYS:
        return f"architecture {h.arch!r} has no config table"
    if (Path(h.path).parent / "tokenizer_config.json").exists():   # AutoTokenizer would take its class from it
        return "a tokenizer_config.json lies beside the GGUF"
    return None

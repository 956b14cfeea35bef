"""The text model of a multimodal wrapper that transformers cannot build as a causal LM (e.g. Kimi-K2.5).

A `KimiK25ForConditionalGeneration` checkpoint keeps a DeepSeek-V3 text model under `language_model.*`
(`language_model.model.layers.N...`, `language_model.lm_head.weight`), next to a vision tower and a projector.
transformers names its own class differently (or lacks it) and maps no causal-LM auto class to the wrapper's
config, so eyas builds only what it trains on: the causal LM of the config's `text_config`, registered under
the same `language_model` prefix, so module paths equal the checkpoint's keys and vLLM's module names. The
vision half is never built; its checkpoint keys are skipped when weights load (target/fastload.py).

`wrapper_config(dir)` reads such a config without remote code when transformers does not know the wrapper's
model type at all: a plain config holding the text config (text model types that are another's checkpoint
format, such as Kimi's `kimi_k2`, are read as that type).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from torch import nn

PREFIX = "language_model"
# text_config model types that transformers reads as another type (the wrapper's own config does the same)
TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}


def _causal_lm_mapping():
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING


def causal_lm_knows(config) -> bool:
    return type(config) in _causal_lm_mapping()


def is_wrapped_text(config) -> bool:
    """A config whose causal LM transformers cannot build, but whose text sub-config it can."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return text is not config and not causal_lm_knows(config) and causal_lm_knows(text)


class WrappedTextLM(nn.Module):
    """`language_model`: the causal LM of `config.text_config`. `config` stays the wrapper's, so the target's
    identity (config hash, architecture) is the same whichever stage or engine reads it."""

    base_model_prefix = "backbone"    # transformers' name for the attribute holding the decoder (native generator)

    def __init__(self, config, language_model: nn.Module):
        super().__init__()
        self.config = config
        self.language_model = language_model
        self.forward = language_model.forward   # the text model's own signature: callers inspect its parameters

    @classmethod
    def from_config(cls, config, **kwargs) -> "WrappedTextLM":
        from transformers import AutoModelForCausalLM

        return cls(config, AutoModelForCausalLM.from_config(config.get_text_config(decoder=True), **kwargs))

    _from_config = from_config

    @classmethod
    def from_pretrained(cls, path, **_):
        raise ValueError(f"{path}: the text model of a multimodal wrapper loads only from a local safetensors "
                         "directory (eyas reads its `language_model.*` keys itself)")

    @property
    def keep_in_fp32(self) -> list[str]:
        """Module names the text model keeps in fp32 whatever the load dtype (DeepSeek-V3's router)."""
        lm = type(self.language_model)
        return list(getattr(lm, "_keep_in_fp32_modules_strict", None) or []) + list(
            getattr(lm, "_keep_in_fp32_modules", None) or [])

    @property
    def backbone(self) -> nn.Module:
        """The text model's decoder (embeddings, layers, final norm), without its lm_head."""
        return getattr(self.language_model, self.language_model.base_model_prefix)

    @property
    def generation_config(self):
        return self.language_model.generation_config

    @property
    def device(self):
        return self.language_model.device

    @property
    def dtype(self):
        return self.language_model.dtype

    def get_input_embeddings(self) -> nn.Module:
        return self.language_model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.language_model.get_output_embeddings()

    def tie_weights(self, *args, **kwargs):
        return self.language_model.tie_weights(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.language_model.generate(*args, **kwargs)

    @staticmethod
    def owns(key: str) -> bool:
        """Is a checkpoint key the text model's? The vision tower's and the projector's are not."""
        return key.startswith(PREFIX + ".")


def wrapper_config(path: str | Path):
    """The config of a wrapper dir whose model type transformers does not know, or None when this is not one
    (no text_config, or a text model type transformers does not know either)."""
    from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = doc.get("text_config")
    if not isinstance(text, dict):
        return None
    text = dict(text)
    text_type = TEXT_MODEL_TYPES.get(text.get("model_type"), text.get("model_type"))
    if text_type not in CONFIG_MAPPING:
        return None
    text.pop("model_type", None)
    text.pop("auto_map", None)      # the text model's remote code is never run
    rest = {k: v for k, v in doc.items() if k not in ("text_config", "auto_map", "model_type")}
    config = PretrainedConfig(**rest)
    config.text_config = AutoConfig.for_model(text_type, **text)
    return config


def unknown_model_type(error: Exception) -> bool:
    """Does a transformers config error say the model type is unknown (or needs remote code to be read)?"""
    return bool(re.search(r"model type|model_type|trust_remote_code|Unrecognized", str(error)))

"""Targets: load (HF dir, hub id, GGUF, built-in names), find layers through wrappers, capture."""

from eyas.aux_layers import default_aux_layer_ids
from eyas.target.capture import capture, document_causal_mask, drop_capture_hooks, packed_position_ids, target_states
from eyas.target.layers import Layout, LayoutError, find_layout, text_config
from eyas.target.load import (BUILTIN_TARGETS, Target, build_meta, load_config, load_target, load_tokenizer,
                              resolve, wrap_model)

__all__ = ["BUILTIN_TARGETS", "Layout", "LayoutError", "Target", "build_meta", "capture", "default_aux_layer_ids",
           "document_causal_mask", "drop_capture_hooks", "find_layout", "load_config", "load_target", "load_tokenizer",
           "packed_position_ids", "resolve", "target_states", "text_config", "wrap_model"]

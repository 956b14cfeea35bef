"""Hidden-state store: sharded safetensors + manifest; atomic, resumable, validated; bf16 or fp8."""

from eyas.store.format import (StoreError, bytes_per_token, config_hash, fp8_decode, fp8_encode,
                               target_identity)
from eyas.store.reader import HiddenStateStore, verify_store

__all__ = ["HiddenStateStore", "StoreError", "bytes_per_token", "config_hash", "fp8_decode", "fp8_encode",
           "target_identity", "verify_store"]

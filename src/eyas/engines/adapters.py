"""The engines eyas serves drafts with, by name (`--engine vllm|sglang`): each an `Engine` (eyas.engines.base)."""

from __future__ import annotations

from eyas.engines.sglang import SglangAdapter
from eyas.engines.vllm import VllmAdapter

ADAPTERS = {"vllm": VllmAdapter, "sglang": SglangAdapter}

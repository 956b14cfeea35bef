"""A fake `vllm` package + a fake engine interpreter, for probe tests without a real vLLM.

`make_fake_vllm(tmp, replace={...})` writes a tiny package that defines every entry point eyas probes with
vLLM 0.32.0's parameter names (only the ones eyas relies on, plus a few it does not), and a `python` wrapper
script that runs the current interpreter with that package first on the path. `replace` maps
(relative file, old text) -> new text, to inject a drifted signature.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

FILES: dict[str, str] = {
    "vllm/__init__.py": (
        "__version__ = '0.32.0'\n"
        "from vllm.entrypoints.llm import LLM\n"
        "from vllm.sampling_params import SamplingParams\n"),
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": (
        "from typing import overload\n"
        "class LLM:\n"
        "    def __init__(self, model: str, *, tokenizer=None, dtype='auto', seed=0, tensor_parallel_size=1,\n"
        "                 gpu_memory_utilization=0.9, enforce_eager=False, **kwargs):\n"
        "        self.llm_engine = None\n"
        "        raise RuntimeError('the probe must never construct an LLM')\n"
        "    @overload\n"
        "    def generate(self, prompts: str) -> list: ...\n"
        "    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def get_metrics(self):\n"
        "        return []\n"),
    "vllm/sampling_params.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class SamplingParams:\n"
        "    n: int = 1\n"
        "    temperature: float = 1.0\n"
        "    top_p: float = 1.0\n"
        "    seed: int | None = None\n"
        "    stop_token_ids: list[int] | None = None\n"
        "    ignore_eos: bool = False\n"
        "    max_tokens: int | None = 16\n"
        "    logprobs: int | None = None\n"
        "    extra_args: dict | None = None\n"
        "    output_kind: int = 0\n"
        "    detokenize: bool = True\n"
        "class RequestOutputKind:  # an Enum in vLLM: a plain class lists the same names live and recorded\n"
        "    CUMULATIVE = 0\n"
        "    DELTA = 1\n"
        "    FINAL_ONLY = 2\n"),
    "vllm/outputs.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class CompletionOutput:\n"
        "    index: int\n"
        "    text: str\n"
        "    token_ids: list\n"
        "    finish_reason: str | None = None\n"
        "class RequestOutput:\n"
        "    def __init__(self, request_id, prompt, prompt_token_ids, outputs, finished, metrics=None):\n"
        "        self.request_id, self.outputs, self.finished = request_id, outputs, finished\n"),
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/llm_engine.py": (
        "class LLMEngine:\n"
        "    def __init__(self, vllm_config, executor_class=None, log_stats=False):\n"
        "        self.vllm_config = vllm_config\n"
        "    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, priority=0):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def step(self):\n"
        "        return []\n"
        "    def has_unfinished_requests(self):\n"
        "        return False\n"),
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class EngineArgs:\n"
        "    model: str = 'x'\n"
        "    dtype: str = 'auto'\n"
        "    seed: int = 0\n"
        "    max_model_len: int | None = None\n"
        "    gpu_memory_utilization: float = 0.9\n"
        "    kv_cache_memory_bytes: int | None = None\n"
        "    max_num_seqs: int | None = None\n"
        "    max_num_batched_tokens: int | None = None\n"
        "    async_scheduling: bool | None = None\n"
        "    tensor_parallel_size: int = 1\n"
        "    enable_expert_parallel: bool = False\n"
        "    language_model_only: bool = False\n"
        "    enforce_eager: bool = False\n"
        "    disable_log_stats: bool = False\n"
        "    speculative_config: dict | None = None\n"
        "    kv_transfer_config: object = None\n"),
    "vllm/v1/__init__.py": "",
    "vllm/v1/metrics/__init__.py": "",
    "vllm/v1/metrics/reader.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Metric:\n"
        "    name: str\n"
        "    labels: dict\n"
        "@dataclass\n"
        "class Counter(Metric):\n"
        "    value: int\n"
        "@dataclass\n"
        "class Vector(Metric):\n"
        "    values: list\n"),
    "vllm/config/__init__.py": ("from vllm.config.kv_transfer import KVTransferConfig\n"
                                "from vllm.config.scheduler import SchedulerConfig\n"
                                "from vllm.config.speculative import SpeculativeConfig\n"
                                "from vllm.config.vllm import VllmConfig\n"),
    "vllm/config/scheduler.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class SchedulerConfig:\n"
        "    max_num_seqs: int = 128\n"
        "    max_num_batched_tokens: int = 2048\n"),
    "vllm/config/vllm.py": (
        "from dataclasses import dataclass, field\n"
        "from vllm.config.scheduler import SchedulerConfig\n"
        "@dataclass\n"
        "class VllmConfig:\n"
        "    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)\n"
        "    speculative_config: object = None\n"),
    "vllm/config/kv_transfer.py": (
        "from dataclasses import dataclass, field\n"
        "@dataclass\n"
        "class KVTransferConfig:\n"
        "    kv_connector: str | None = None\n"
        "    kv_role: str | None = None\n"
        "    kv_connector_module_path: str | None = None\n"
        "    kv_connector_extra_config: dict = field(default_factory=dict)\n"),
    "vllm/config/speculative.py": (
        "from dataclasses import dataclass\n"
        "from typing import Literal\n"
        "MTPModelTypes = Literal['mtp']\n"
        "DFlashModelTypes = Literal['dflash']\n"
        "EagleModelTypes = Literal['eagle', 'eagle3', 'extract_hidden_states', MTPModelTypes, DFlashModelTypes]\n"
        "SpeculativeMethod = Literal['ngram', 'draft_model', EagleModelTypes]\n"
        "@dataclass\n"
        "class SpeculativeConfig:\n"
        "    num_speculative_tokens: int | None = None\n"
        "    model: str | None = None\n"
        "    method: SpeculativeMethod | None = None\n"
        "    draft_model_config: object = None\n"),
    "vllm/transformers_utils/__init__.py": "",
    "vllm/transformers_utils/configs/__init__.py": "",
    "vllm/transformers_utils/configs/speculators/__init__.py": "",
    "vllm/transformers_utils/configs/speculators/base.py": (
        "class SpeculatorsConfig:\n"
        "    @classmethod\n"
        "    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    @classmethod\n"
        "    def extract_vllm_speculative_config(cls, config_dict):\n"
        "        return {}\n"),
    "vllm/transformers_utils/configs/speculators/algos.py": (
        "def update_eagle3(config_dict: dict, pre_trained_config: dict) -> None:\n"
        "    pre_trained_config['draft_vocab_size'] = config_dict.get('draft_vocab_size')\n"
        "def update_peagle(config_dict: dict, pre_trained_config: dict) -> None:\n"
        "    pre_trained_config['pard_token'] = config_dict['mask_token_id']\n"
        "def update_dflash(config_dict: dict, pre_trained_config: dict) -> None:\n"
        "    pre_trained_config['architectures'] = ['DFlashDraftModel']\n"),
    # --- the draft classes the registry maps the updaters' architectures to
    "vllm/model_executor/models/llama_eagle3.py": (
        "class Eagle3LlamaForCausalLM:\n"
        "    def __init__(self, vllm_config, prefix=''):\n"
        "        pass\n"
        "    def compute_logits(self, hidden_states):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def combine_hidden_states(self, hidden_states):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def load_weights(self, weights):\n"
        "        raise RuntimeError('never called by the probe')\n"),
    "vllm/model_executor/models/qwen3_dflash.py": (
        "class DFlashQwen3ForCausalLM:\n"
        "    def compute_logits(self, hidden_states):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def load_weights(self, weights):\n"
        "        raise RuntimeError('never called by the probe')\n"),
    # --- what a Kimi-K2.5 target needs (probed only for one)
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": (
        "_MULTIMODAL_MODELS = {\n"
        "    'LlavaForConditionalGeneration': ('llava', 'LlavaForConditionalGeneration'),\n"
        "    'KimiK25ForConditionalGeneration': ('kimi_k25', 'KimiK25ForConditionalGeneration'),\n"
        "}\n"
        "_SPECULATIVE_DECODING_MODELS = {\n"
        "    'DFlashDraftModel': ('qwen3_dflash', 'DFlashQwen3ForCausalLM'),\n"
        "    'PeagleLlamaForCausalLM': ('llama_eagle3', 'Eagle3LlamaForCausalLM'),\n"
        "    'Eagle3LlamaForCausalLM': ('llama_eagle3', 'Eagle3LlamaForCausalLM'),\n"
        "}\n"),
    "vllm/model_executor/models/deepseek_v2.py": (
        "class DeepseekV2Model:\n"
        "    def __init__(self, vllm_config, prefix=''):\n"
        "        self.embed_tokens, self.layers, self.norm = None, [], None\n"
        "        self.aux_hidden_state_layers = ()\n"
        "class DeepseekV2ForCausalLM:\n"
        "    def __init__(self, vllm_config, prefix=''):\n"
        "        self.model, self.lm_head = DeepseekV2Model(vllm_config), None\n"
        "    def set_aux_hidden_state_layers(self, layers):\n"
        "        self.model.aux_hidden_state_layers = layers\n"),
    "vllm/model_executor/models/kimi_k25.py": (
        "class KimiK25ForConditionalGeneration:\n"
        "    hf_to_vllm_mapper = None\n"
        "    def __init__(self, vllm_config, prefix=''):\n"
        "        self.vision_tower = self.mm_projector = self.language_model = None\n"
        "    def compute_logits(self, hidden_states):\n"
        "        raise RuntimeError('never called by the probe')\n"
        "    def set_aux_hidden_state_layers(self, layers):\n"
        "        self.language_model.set_aux_hidden_state_layers(layers)\n"
        "    def get_eagle3_aux_hidden_state_layers(self):\n"
        "        return (2, 4, 5)\n"
        "    def load_weights(self, weights):\n"
        "        raise RuntimeError('never called by the probe')\n"),
    "vllm/transformers_utils/config.py": (
        "class LazyConfigDict(dict):\n"
        "    pass\n"
        "_CONFIG_REGISTRY = LazyConfigDict(kimi_k2='DeepseekV3Config', kimi_k25='Kimi_K25Config')\n"),
    "vllm/transformers_utils/processors/__init__.py": "",
    "vllm/transformers_utils/processors/kimi_k25_vision_fused.py": (
        "class KimiK25FusedVisionProcessor:\n"
        "    def __init__(self, media_proc_cfg, **kwargs):\n"
        "        self.media_proc_cfg = media_proc_cfg\n"),
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_transfer/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py": (
        "from dataclasses import dataclass\n"
        "def extract_from_kv_cache(kv_cache, slot_mapping, num_tokens):\n"
        "    raise RuntimeError('never called by the probe')\n"
        "@dataclass\n"
        "class PendingSave:\n"
        "    req_id: str\n"
        "    filename: str\n"
        "    token_ids: object\n"
        "    block_ids: list\n"
        "class ExampleHiddenStatesConnector:\n"
        "    def __init__(self, vllm_config, role, kv_cache_config=None):\n"
        "        self._block_size = 16\n"
        "        self._kv_cache = None\n"
        "        self._is_tp_rank_zero = True\n"
        "        self.use_lock = True\n"
        "        self._lock_fds = {}\n"
        "        self._req_copy_events = {}\n"
        "    def _submit_async_write(self, pending):\n"
        "        raise RuntimeError('never called by the probe')\n"),
}


def make_fake_vllm(tmp: Path, replace: dict[tuple[str, str], str] | None = None) -> Path:
    """Write the fake package under tmp/src and return the path of a fake engine interpreter."""
    src = Path(tmp) / "src"
    files = dict(FILES)
    for (rel, old), new in (replace or {}).items():
        if old not in files[rel]:
            raise KeyError(f"fake vllm: {old!r} not in {rel}")
        files[rel] = files[rel].replace(old, new)
    for rel, text in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    py = Path(tmp) / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    # run_in_env drops PYTHONPATH from the environment, so the wrapper sets it itself, like a venv would.
    py.write_text(f"#!/bin/sh\nPYTHONPATH={src} exec {sys.executable} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return py

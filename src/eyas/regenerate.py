"""`eyas regenerate`: picks the backend, then runs the stage (eyas.data.regenerate).

The target answers in this process (hf, native), on an OpenAI-compatible server (openai), or in vLLM's engine in
its own environment (vllm, eyas.engines.vllm_generate). The data package builds the first three itself; the
engine is started here, so that eyas.data never imports eyas.engines (which imports data and store).
"""

from __future__ import annotations

from pathlib import Path

from eyas.data.prepare import report
from eyas.data.regenerate import RegenerateConfig
from eyas.data.regenerate import regenerate as regenerate_stage
from eyas.devices import TORCH_NAMES

__all__ = ["RegenerateConfig", "regenerate", "run", "vllm_backend"]


def vllm_backend(cfg: RegenerateConfig):
    from eyas.engines.vllm_generate import VllmBackend

    return VllmBackend(cfg.target, python=cfg.python, dtype=TORCH_NAMES.get(cfg.dtype, "bfloat16"),  # auto = bf16
                       max_new_tokens=cfg.max_new_tokens, max_prompt_tokens=cfg.max_prompt_tokens,
                       temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed,
                       tensor_parallel_size=cfg.tensor_parallel_size, max_num_seqs=cfg.engine_max_seqs,
                       max_num_batched_tokens=cfg.engine_max_batched_tokens, max_in_flight=cfg.engine_in_flight,
                       replicas=cfg.engine_replicas, async_scheduling=cfg.engine_async_scheduling,
                       enforce_eager=cfg.graph == "eager", gpu_memory_utilization=cfg.gpu_memory_utilization,
                       startup_timeout_s=cfg.engine_startup_timeout, text_only=cfg.text_only,
                       log=Path(cfg.out).with_name(Path(cfg.out).name + ".vllm.log"))


def regenerate(cfg: RegenerateConfig, backend=None) -> dict:
    """The stage with any backend: `backend` as given (tests, callers holding a model), else built from cfg."""
    if backend is None and cfg.backend == "vllm":
        backend = vllm_backend(cfg)
    return regenerate_stage(cfg, backend)


def run(cfg: RegenerateConfig):
    return report(regenerate(cfg), cfg.json)

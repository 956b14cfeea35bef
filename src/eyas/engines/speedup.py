"""Served speedup with an eyas draft, for any Engine: greedy tokens/s with and without speculative decoding.

Each configuration (the plain target, then each speculation: a chain of K, or with SGLang a tree) is one engine
started by the engine's serve worker in bench mode (serve_timing.py), in the engine's own environment. Jobs go
round-robin over the GPUs; on each GPU they run in waves of `engines_per_gpu` engines that share its memory
(`Engine.share_memory`: vLLM gets an explicit KV cache each, SGLang a memory fraction). An engine's start-up
(compile, graph capture) takes minutes and its timing well under one, so a wave's engines start side by side,
wait at a barrier until all of the wave are up (or have failed), then take turns timing under one lock per GPU;
the next wave starts when the last one has finished. Start-ups overlap; a timing never overlaps another
engine's start-up or timing on its GPU. An engine whose memory sizing cannot see its neighbours
(`Engine.starts_one_at_a_time`: SGLang charges every byte that another engine takes while it loads against its
own KV budget) starts each engine of a wave only once the one before it is up or has failed.

The report is what a user asks before serving a draft: tokens/s at batch 1, 8, 32 for each speculation, the
speedup over the plain target at the same batch, the engine's own τ and per-position acceptance, whether the
outputs equal the plain target's, and each engine's seconds (start-up, waiting, timing, in all) plus the
whole sweep's. `on_result` hears of each engine as it finishes, so a caller can keep what is done when the sweep
is cut short; `report` summarises any subset (no base: tokens/s without speedups; a failed engine: under
"failed").
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Callable

from eyas.decode.tree import TreeSpec
from eyas.engines.base import Engine, SpecStats, run_in_env
from eyas.target.load import engine_path


def job_name(spec: TreeSpec) -> str:
    return f"k{spec.depth}" if spec.is_chain else f"t{spec.total}-{spec.depth}-{spec.topk}"


def spec_fields(spec: TreeSpec) -> dict:
    """How a row names its speculation: `chain` K, or the `tree` as --tree spells it."""
    tree = f"total={spec.total},depth={spec.depth},topk={spec.topk}"
    return {"spec": spec.label(), **({"chain": spec.depth} if spec.is_chain else {"tree": tree})}


def tok_s(run: dict) -> float:
    return run["generated_tokens"] / run["seconds"]


def summarize(base: dict | None, spec: dict[TreeSpec | int, dict], stats: Callable[[dict], SpecStats]) -> dict:
    """Rows of (speculation, batch) against the plain target's run at the same batch; `base` / `spec[s]` are worker
    outputs (an int key is a chain of that length), `stats` reads the engine's counters. Without `base` (its engine
    failed or has not finished) rows have tokens/s and τ but no speedup."""
    base_runs = {r["batch_size"]: r for r in base["runs"]} if base else {}
    rows = []
    specs = {TreeSpec.chain(k) if isinstance(k, int) else k: doc for k, doc in spec.items()}
    for s, doc in sorted(specs.items(), key=lambda kv: (kv[0].topk, kv[0].total, kv[0].depth)):
        for r in doc["runs"]:
            row = {**spec_fields(s), "batch_size": r["batch_size"], "tok_s": tok_s(r), **stats(r["counters"]).as_dict()}
            if len(r.get("round_seconds", ())) > 1:  # every round's rate: how far a neighbour moved the slowest
                row["round_tok_s"] = [r["generated_tokens"] / t for t in r["round_seconds"]]
            b = base_runs.get(r["batch_size"])
            if b:
                same = sum(o == p for o, p in zip(r["outputs"], b["outputs"]))
                row.update(base_tok_s=tok_s(b), speedup=tok_s(r) / tok_s(b),
                           identical_to_base=f"{same}/{len(r['outputs'])}")
            rows.append(row)
    best = {}
    for row in rows:
        b = row["batch_size"]
        if "speedup" in row and (b not in best or row["speedup"] > best[b]["speedup"]):
            best[b] = row
    out = {"base_tok_s": {str(b): tok_s(r) for b, r in sorted(base_runs.items())}}
    if any(len(r.get("round_seconds", ())) > 1 for r in base_runs.values()):
        out["base_round_tok_s"] = {str(b): [r["generated_tokens"] / t for t in r["round_seconds"]]
                                   for b, r in sorted(base_runs.items())}
    keep = ("spec", "chain", "tree", "speedup", "tau")
    return {**out, "rows": rows,
            "best_by_batch": {str(b): {k: r[k] for k in keep if k in r} for b, r in sorted(best.items())}}


def wait_until_up(wave_dir: Path, job: tuple, poll_s: float = 0.5) -> None:
    """Block until the started `job` (name, future) is up (its worker wrote `<name>.ready` at the barrier), has
    failed (`.failed`) or has ended."""
    name, fut = job
    while not fut.done() and not any((wave_dir / f"{name}{ext}").exists() for ext in (".ready", ".failed")):
        time.sleep(poll_s)


PER_ENGINE = ("gpu", "startup_s", "wait_s", "measure_s", "rounds", "wall_s", "barrier_timed_out", "start_after_s",
              "start_after_timed_out", "gpu_memory_utilization", "kv_cache_memory_bytes")


def report(engine: Engine, done: dict[str, dict], specs: dict[str, TreeSpec]) -> dict:
    """The summary of the engines finished so far ({job: worker output or {"error": ...}}), partial or whole."""
    ok = {name: doc for name, doc in done.items() if "error" not in doc}
    out = summarize(ok.get("base"), {specs[name]: doc for name, doc in ok.items() if name != "base"},
                    engine.spec_stats)
    out["failed"] = {name: doc["error"] for name, doc in done.items() if "error" in doc}
    out["engines"] = {name: {t: doc[t] for t in PER_ENGINE if t in doc} for name, doc in done.items()}
    out["engine"] = engine.name
    out["engine_version"] = next((doc.get("version") for doc in ok.values()), None)
    return out


def measure(engine: Engine, target: str, export: str, prompts: list[list[int]], specs: list[TreeSpec | int],
            batch_sizes: list[int], max_tokens: int, gpus: list[str], log_dir: Path,
            max_model_len: int = 2048, engines_per_gpu: int = 1,
            on_result: Callable[[str, dict], None] | None = None, barrier_timeout_s: float = 900.0,
            rounds: int = 1, start_after: str | None = None, dtype: str = "bf16",
            engine_options: dict | None = None) -> dict:
    """Run the plain target and each speculation (an int: a chain of that length), round-robin over `gpus`, up to
    `engines_per_gpu` engines per GPU at once. `export` may name one export per chain length as a pattern,
    e.g. "/tmp/export-k{k}" (vLLM takes K from the export). `on_result(job, doc)` is called (one call at a time)
    as each engine finishes: doc is the worker's output, or {"error": ...} when its engine failed; either way
    with "gpu" and "wall_s". A failed engine does not stop the sweep: it is listed under "failed". start_after:
    a file; no engine times before it exists. `engine_options` go to every engine's request (e.g. SGLang's
    attention_backend). Returns `report` of all engines plus "sweep_s"."""
    target = engine_path(target)   # a built-in name or a dir: the engine gets the local dir
    todo = {job_name(s): s for s in (TreeSpec.chain(k) if isinstance(k, int) else k for k in specs)}
    jobs = {"base": None, **{name: export.format(k=s.depth) for name, s in todo.items()}}
    log_dir.mkdir(parents=True, exist_ok=True)
    n = max(1, engines_per_gpu)
    memory = engine.share_memory(jobs, target, n, max(batch_sizes), max_model_len, dtype)  # before any start
    done, one_at_a_time, t_sweep = {}, threading.Lock(), time.perf_counter()
    one_by_one = n > 1 and bool(getattr(engine, "starts_one_at_a_time", False))

    def one(name: str, g: int, wave_dir: Path, count: int) -> None:
        request = engine.bench_request(target, jobs[name], todo.get(name), dtype=dtype, max_model_len=max_model_len,
                                       enforce_eager=False, seed=0, **memory[name], **(engine_options or {}))
        payload = {"engine": request, "prompts": prompts, "max_tokens": max_tokens, "batch_sizes": batch_sizes,
                   "rounds": rounds, "measure_lock": str(wave_dir.parent / f"gpu{g}.lock"),
                   "start_after": start_after,
                   "barrier": {"dir": str(wave_dir), "name": name, "count": count, "timeout_s": barrier_timeout_s}}
        t0 = time.perf_counter()
        try:
            doc = run_in_env(engine.python, engine.worker, payload, log=log_dir / f"{name}.log",
                             env={**engine.env(), "CUDA_VISIBLE_DEVICES": gpus[g]})
        except Exception as e:  # noqa: BLE001 - any failure is this engine's result, not the sweep's end
            (wave_dir / f"{name}.failed").touch()  # counts at the barrier: the rest of the wave need not wait for it
            doc = {"error": str(e) or repr(e)}
        doc.update(gpu=gpus[g], wall_s=time.perf_counter() - t0, **memory[name])  # what it was given
        with one_at_a_time:
            done[name] = doc
            if on_result:
                on_result(name, doc)

    def lane(g: int, tmp: Path) -> None:
        """GPU g's jobs in waves: a wave starts when the one before has finished, so no start-up meets a timing."""
        mine = list(jobs)[g::len(gpus)]
        for w in range(0, len(mine), n):
            wave, wave_dir = mine[w:w + n], tmp / f"gpu{g}-wave{w // n}"
            wave_dir.mkdir()
            with ThreadPoolExecutor(len(wave)) as pool:
                started = []
                for name in wave:
                    if started and one_by_one:
                        wait_until_up(wave_dir, started[-1])
                    started.append((name, pool.submit(one, name, g, wave_dir, len(wave))))
                for _, fut in started:
                    fut.result()

    with TemporaryDirectory(prefix=f"eyas-{engine.name}-speedup-") as tmp, ThreadPoolExecutor(len(gpus)) as pool:
        list(pool.map(lambda g: lane(g, Path(tmp)), range(len(gpus))))
    return {**report(engine, done, todo), "sweep_s": time.perf_counter() - t_sweep}

"""Bench mode of the serve workers (vllm_serve_worker.py, sglang_serve_worker.py): timing one engine's greedy runs.

Runs INSIDE an engine's environment: standard library only. A worker loads this file by path (`load_timing()` in
each worker), since the workers' folder cannot be on sys.path there (it holds eyas's vllm.py and sglang.py, which
would shadow the engines). The worker passes two callables: `generate(prompts, max_tokens) -> [[ids], ...]` and
`counters() -> {name: value | [values]}`, the engine's cumulative acceptance counters.

Request fields (IN.json), beside the worker's own:
  "batch_sizes": [1, 8, 32]: b requests in flight at a time; each batch size is timed in "rounds" rounds (default
      1) after one warm-up pass over every batch size (16 tokens each); the fastest round is reported.
  "barrier": {"dir": PATH, "count": n, "timeout_s": 900, "name": id}: once its engine is up, the worker writes
      `<dir>/<name>.ready` and waits until n distinct names have a `.ready` or `.failed` file there (the caller
      writes `<name>.failed` for an engine that died), so no engine times while another of its wave still starts;
  "start_after": PATH: no engine times before this file exists (untimed work sharing the GPU finishes first);
  "measure_lock": PATH: an exclusive flock around each round (the first with the warm-up), so one engine times
      at once and the engines of a wave take turns round by round.
Result fields: "runs": [{"batch_size", "seconds", "generated_tokens", "requests", "counters" (deltas over this
run), "outputs", "round_seconds"}], "wait_s" (engine up to holding the lock, over rounds), "measure_s" (holding
it), "rounds", and "barrier_timed_out" / "start_after_s" / "start_after_timed_out" when asked for.
"""

import contextlib
import fcntl
import os
import time


def delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, list):
            prev = before.get(k) or []
            out[k] = [x - (prev[i] if i < len(prev) else 0) for i, x in enumerate(v)]
        else:
            out[k] = (v or 0) - (before.get(k) or 0)
    return out


def wait_for_file(path: str, timeout_s: float) -> tuple[float, bool]:
    """Wait until `path` exists: (seconds waited, whether it timed out)."""
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout_s:
            return time.monotonic() - t0, True
        time.sleep(0.2)
    return time.monotonic() - t0, False


def wait_at_barrier(barrier: dict) -> bool:
    """Say this engine is up, then wait for the rest of its wave (ready or failed); True if the wait timed out."""
    d = barrier["dir"]
    open(os.path.join(d, f"{barrier.get('name', os.getpid())}.ready"), "w").close()
    deadline = time.monotonic() + barrier.get("timeout_s", 900)
    # distinct names: an engine that timed out here and then died has both a .ready and a .failed file
    while len({os.path.splitext(f)[0] for f in os.listdir(d)}) < barrier["count"]:
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def exclusive(lock_path):
    """Hold an exclusive flock on `lock_path` (nothing when None), released on leaving, even on an error.

    The release is an explicit unlock, not the file's close: an engine forks its core process while the lock is
    held, the child inherits the descriptor, and a close here would leave the lock held for the engine's whole
    life (two vLLM replicas on an H200 waited forever so)."""
    if not lock_path:
        yield
        return
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def timed_runs(generate, counters, prompts, max_tokens, batch_sizes) -> list:
    runs = []
    for b in batch_sizes:
        before = counters()
        outputs, t0 = [], time.perf_counter()
        for i in range(0, len(prompts), b):
            outputs += generate(prompts[i:i + b], max_tokens)
        seconds = time.perf_counter() - t0
        runs.append({"batch_size": b, "seconds": seconds, "requests": len(outputs),
                     "generated_tokens": sum(len(o) for o in outputs), "counters": delta(counters(), before),
                     "outputs": outputs})
        print(f"batch {b}: {runs[-1]['generated_tokens'] / seconds:.1f} tok/s", flush=True)
    return runs


def fastest(rounds: list) -> list:
    """Per batch size the round with the fewest seconds (greedy: every round generates the same tokens), with every
    round's seconds beside it: a neighbour's burst slows one round, not the best of them."""
    out = []
    for per_b in zip(*rounds):
        best = dict(min(per_b, key=lambda r: r["seconds"]))
        best["round_seconds"] = [r["seconds"] for r in per_b]
        out.append(best)
    return out


def bench(req: dict, generate, counters) -> dict:
    """Bench mode for an engine that is up: the result fields listed above."""
    doc, t0 = {}, time.perf_counter()
    if req.get("barrier"):
        doc["barrier_timed_out"] = wait_at_barrier(req["barrier"])
    if req.get("start_after"):
        doc["start_after_s"], doc["start_after_timed_out"] = wait_for_file(
            req["start_after"], (req.get("barrier") or {}).get("timeout_s", 900))
    rounds, waited, measured, n = [], 0.0, 0.0, max(1, int(req.get("rounds", 1)))
    for r in range(n):
        # the lock is taken per round, so the engines of a GPU take turns round by round (each timed at several
        # moments of the wave, none of them always first)
        with exclusive(req.get("measure_lock")):
            t1 = time.perf_counter()
            if r == 0:  # shapes first met here (sampler, lazily compiled kernels) are not paid in a timed run
                for b in req["batch_sizes"]:
                    generate(req["prompts"][:b], 16)
            rounds.append(timed_runs(generate, counters, req["prompts"], req["max_tokens"], req["batch_sizes"]))
            t2 = time.perf_counter()
        if r + 1 < n:
            time.sleep(1.0)  # flock is not fair: a pause lets an engine waiting for the lock take its turn
        waited, measured, t0 = waited + t1 - t0, measured + t2 - t1, time.perf_counter()
    return {**doc, "runs": fastest(rounds), "wait_s": waited, "measure_s": measured, "rounds": len(rounds)}

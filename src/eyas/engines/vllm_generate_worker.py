"""Runs INSIDE the vLLM environment (stdlib + vllm only): a long-lived generation server for `eyas regenerate
--backend vllm`, with requests streaming in and answers streaming out (continuous batching).

    python vllm_generate_worker.py CONFIG.json
CONFIG: {model, dtype, max_model_len, tensor_parallel_size, seed, enforce_eager, max_num_seqs,
max_num_batched_tokens, gpu_memory_utilization and async_scheduling (optional: vLLM's default when absent),
startup_lock (optional: a file locked while the engine is built, so replicas sharing a GPU build one at a time)}
stdin, one JSON object per line:
    {"id": N, "prompt": [token ids], "max_tokens", "temperature", "top_p", "seed", "stop_token_ids"}
    {"close": true} (or an empty line, or EOF): finish what is in flight, report, exit
stdout, each line prefixed with `EYAS> ` (vLLM may print its own lines there too):
    {"ready": true, "max_num_seqs": N, "max_num_batched_tokens": M}   once the engine is up
    {"id": N, "tokens": [generated ids], "finish": "stop" | "length" | "error: ..."}   as each request ends
    {"closed": true, "requests", "steps", "step_s", "busy_s", "in_flight_per_step", "by_load"}     last
by_load: the steps grouped by requests in the engine (quarters of the most seen): steps, seconds, in flight per
step, and in_flight_per_s (requests x steps / seconds: the decode rate if every request in the engine got a token
each step; an upper bound, since requests waiting in vLLM's queue are counted) -- the full window's rate apart from
the tail's, where a few long conversations run alone.
A reader thread queues stdin; the main loop adds whatever is queued to vLLM's engine, steps it, and prints each
finished request at once, so eyas can send a conversation's next turn while the others still run. It blocks on
the queue only when the engine has nothing to do. eyas decodes the ids itself (they include the stop token, as
vLLM returns them), exactly as it decodes the hf backend's, so both backends' texts compare token for token.
"""

import importlib.util
import json
import os
import queue
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def by_load(trace: list) -> list:
    """[(requests in the engine, step seconds)] -> per quarter of the largest load: steps, seconds, rates."""
    top = max((n for n, _ in trace), default=0)
    out = []
    for q in range(4):
        lo, hi = top * q / 4, top * (q + 1) / 4
        part = [(n, dt) for n, dt in trace if lo < n <= hi or (q == 0 and n == 0)]
        if not part:
            continue
        n_sum, sec = sum(n for n, _ in part), sum(dt for _, dt in part)
        out.append({"in_flight": [int(lo) + 1, int(hi)], "steps": len(part), "seconds": round(sec, 3),
                    "in_flight_per_step": round(n_sum / len(part), 1),
                    "in_flight_per_s": round(n_sum / sec, 1) if sec else None})
    return out


def startup_lock(path):
    """Holds `path` locked (None: nothing): vLLM sizes its KV cache from free GPU memory measured around a profile
    run, which another engine starting on the same GPU would corrupt. The serve workers' lock, loaded from its file
    (this directory is off sys.path)."""
    spec = importlib.util.spec_from_file_location("serve_timing", os.path.join(_HERE, "serve_timing.py"))
    timing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing)
    return timing.exclusive(path)


def emit(obj: dict) -> None:
    print("EYAS> " + json.dumps(obj), flush=True)


def read_stdin(inbox: "queue.Queue") -> None:
    """Every request line onto the queue; None once the driver closes (or goes away)."""
    try:
        for line in sys.stdin:
            if not line.strip():
                break
            msg = json.loads(line)
            if msg.get("close"):
                break
            inbox.put(msg)
    finally:
        inbox.put(None)


def main(cfg_path: str) -> None:
    cfg = json.load(open(cfg_path))
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    extra = {k: int(cfg[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if cfg.get(k)}
    if cfg.get("gpu_memory_utilization"):
        extra["gpu_memory_utilization"] = float(cfg["gpu_memory_utilization"])
    if cfg.get("language_model_only"):
        extra["language_model_only"] = True
    if "async_scheduling" in cfg:
        extra["async_scheduling"] = bool(cfg["async_scheduling"])
    with startup_lock(cfg.get("startup_lock")):
        llm = LLM(model=cfg["model"], dtype=cfg.get("dtype", "bfloat16"), seed=cfg.get("seed", 0),
                  max_model_len=cfg.get("max_model_len", 4096), disable_log_stats=True,
                  enforce_eager=cfg.get("enforce_eager", False),
                  tensor_parallel_size=cfg.get("tensor_parallel_size", 1), **extra)
    engine = llm.llm_engine
    sched = engine.vllm_config.scheduler_config  # what the engine settled on, defaults included
    emit({"ready": True, "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens})

    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=read_stdin, args=(inbox,), daemon=True).start()
    live: dict[str, int] = {}  # vLLM request id -> eyas's id
    closing = False
    steps = held = added = 0
    step_s = busy_s = 0.0
    trace: list = []  # (requests in the engine, seconds) per step
    busy_since = None

    def add(msg: dict) -> None:
        nonlocal added
        # FINAL_ONLY: a step returns a request once, when it has finished (no per-token copies); detokenize=False:
        # eyas reads token ids only, and vLLM would otherwise detokenize every running request at every step on
        # the engine's one CPU thread (with ~2,000 requests in flight, a cost of the same order as the GPU step)
        # with stop_token_ids given, they alone stop it (eyas's stop set, eyas.target.special): ignore_eos drops
        # vLLM's tokenizer-side eos, which a tokenizer converted by another transformers may name wrongly
        stop = msg.get("stop_token_ids")
        params = SamplingParams(temperature=msg.get("temperature", 0.0), top_p=msg.get("top_p", 1.0),
                                max_tokens=msg["max_tokens"], seed=msg.get("seed"), stop_token_ids=stop,
                                ignore_eos=stop is not None, output_kind=RequestOutputKind.FINAL_ONLY,
                                detokenize=False)
        rid = str(msg["id"])
        try:  # eyas's own id: vLLM's RequestOutput.request_id gives back the id it was added with
            engine.add_request(rid, {"prompt_token_ids": msg["prompt"]}, params)
        except Exception as e:  # noqa: BLE001 - a request vLLM refuses fails its row, not the run
            emit({"id": msg["id"], "tokens": [], "finish": f"error: {type(e).__name__}: {str(e)[:300]}"})
            return
        live[rid] = msg["id"]
        added += 1

    while True:
        # idle: wait for the driver; busy: take whatever has come in since the last step, then step again
        if not live and not closing:
            msg = inbox.get()
            closing = msg is None
            if msg is not None:
                add(msg)
        while not closing:
            try:
                msg = inbox.get_nowait()
            except queue.Empty:
                break
            closing = msg is None
            if msg is not None:
                add(msg)
        if not live:
            if closing:
                break
            continue
        if not engine.has_unfinished_requests():  # never seen; without it the driver would wait forever
            for rid, key in live.items():
                emit({"id": key, "tokens": [], "finish": "error: vLLM dropped the request"})
            live.clear()
            continue
        t0 = time.perf_counter()
        busy_since = busy_since or t0
        outs = engine.step()
        t1 = time.perf_counter()
        steps, held, step_s = steps + 1, held + len(live), step_s + t1 - t0
        trace.append((len(live), t1 - t0))
        for out in outs:
            if out.finished and out.request_id in live:
                c = out.outputs[0]
                emit({"id": live.pop(out.request_id), "tokens": list(c.token_ids), "finish": c.finish_reason})
        if not live:
            busy_s += t1 - busy_since
            busy_since = None
    emit({"closed": True, "requests": added, "steps": steps, "step_s": round(step_s, 3), "busy_s": round(busy_s, 3),
          "in_flight_per_step": round(held / steps, 1) if steps else None, "by_load": by_load(trace)})


if __name__ == "__main__":
    main(sys.argv[1])

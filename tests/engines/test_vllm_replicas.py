"""`regenerate --backend vllm --engine-replicas N`: N engine processes share one GPU, requests spread over them.

On the stand-in `vllm` of test_vllm_generate (greedy with transformers on a tiny model): the replicas' answers are
the single engine's and the hf backend's, both replicas serve, one dying stops the run naming its log, and the
flags reach vLLM's LLM (a memory share only with N > 1, async_scheduling only when asked).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from eyas.data.backends import HFBackend
from eyas.regenerate import RegenerateConfig, regenerate
from eyas.engines.base import EngineError
from eyas.engines.vllm_generate import VllmBackend, worker_config
from eyas.engines.vllm_replicas import memory_share, replica_log
from eyas.engines.serve_timing import exclusive
from tests.data.test_regenerate import conv
from tests.engines.test_base import alive
from tests.engines.test_vllm_generate import FAKE_VLLM, fake_vllm_python, target  # noqa: F401 (fixture)

# The greedy stand-in with the tiny target's (llama) modelling imported as the process starts (as vLLM's own
# imports are), so that only building the model falls under the replicas' start-up lock; one torch thread each, as
# two share the test's CPUs.
GREEDY = ("import torch\ntorch.set_num_threads(1)\nimport transformers.models.llama.modeling_llama\n"
          + FAKE_VLLM)

# A stand-in without torch (it starts in a blink): every request ends at its first step with three plain tokens.
# Per process it records what its LLM was built with and when (import, build start and end; a build takes 0.3 s,
# so two at once would overlap). With $FAKE_VLLM_DIE, the first process to step claims that file and dies there,
# as an engine whose GPU fails mid-run.
LIGHT = """
import json, os, sys, time
from types import SimpleNamespace
from vllm.sampling_params import SamplingParams
_IMPORTED = time.time()

class _Engine:
    def __init__(self):
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=256,
                                                                            max_num_batched_tokens=8192))
        self.live = []
    def add_request(self, request_id, prompt, params):
        self.live.append((request_id, params.max_tokens))
    def has_unfinished_requests(self):
        return bool(self.live)
    def step(self):
        if os.environ.get("FAKE_VLLM_DIE"):
            try:
                os.close(os.open(os.environ["FAKE_VLLM_DIE"], os.O_CREAT | os.O_EXCL))
                print("stand-in engine crashed: the GPU fell off the bus", file=sys.stderr, flush=True)
                os._exit(7)
            except FileExistsError:  # another replica is the one that dies
                pass
        done = [SimpleNamespace(request_id=r, finished=True, outputs=[SimpleNamespace(
            token_ids=[100, 101, 102][:n], finish_reason="length")]) for r, n in self.live]
        self.live = []
        return done

class LLM:
    def __init__(self, model, **kw):
        t0 = time.time()
        if os.environ.get("FAKE_VLLM_HANG"):  # an engine that never comes up
            time.sleep(3600)
        if os.environ.get("FAKE_VLLM_SPOILED"):  # the first start meets a neighbour freeing GPU memory
            try:
                os.close(os.open(os.environ["FAKE_VLLM_SPOILED"], os.O_CREAT | os.O_EXCL))
                raise AssertionError("Error in memory profiling. Initial free memory 70.76 GiB, current free "
                                     "memory 76.65 GiB")
            except FileExistsError:
                pass
        if os.environ.get("FAKE_VLLM_FORK"):  # vLLM on a GPU: the engine core is a forked child, all fds inherited
            parent = os.getpid()
            if os.fork() == 0:
                while os.getppid() == parent:
                    time.sleep(0.05)
                os._exit(0)
        time.sleep(0.3)
        self.llm_engine = _Engine()
        with open(os.path.join(os.environ["FAKE_VLLM_KW"], f"{os.getpid()}.json"), "w") as f:
            json.dump({"kw": kw, "imported": _IMPORTED, "built": [t0, time.time()]}, f)
"""


@pytest.fixture
def light(tmp_path, monkeypatch):
    kw = tmp_path / "kw"
    kw.mkdir()
    monkeypatch.setenv("FAKE_VLLM_KW", str(kw))
    return fake_vllm_python(tmp_path, LIGHT), kw


def builds(kw_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(kw_dir.glob("*.json"))]


def test_replicas_answer_as_one_engine_and_the_hf_backend(target, tmp_path):  # noqa: F811
    engine = fake_vllm_python(tmp_path, GREEDY, os.pathsep + os.pathsep.join(sys.path[1:]))
    rows = [conv(0, 1), conv(1, 3), conv(2, 2, tag="x" * 400), conv(3, 2), conv(4, 1)]
    data = tmp_path / "in.json"
    data.write_text(json.dumps(rows))
    common = dict(target=str(target), data=str(data), max_new_tokens=7, max_prompt_tokens=300)
    one = regenerate(RegenerateConfig(**common, out=tmp_path / "v1.jsonl", backend="vllm", python=str(engine)))
    two = regenerate(RegenerateConfig(**common, out=tmp_path / "v2.jsonl", backend="vllm", python=str(engine),
                                      engine_replicas=2))
    from eyas.target.load import load_target

    t = load_target(str(target), dtype=torch.float32, device="cpu")
    hf = regenerate(RegenerateConfig(**common, out=tmp_path / "h.jsonl"),
                    backend=HFBackend(str(target), model=t.model, tokenizer=t.tokenizer, device="cpu",
                                      max_new_tokens=7, max_prompt_tokens=300, batch_size=1))
    by_row = lambda p: {r["row"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    assert by_row(tmp_path / "v2.jsonl") == by_row(tmp_path / "v1.jsonl") == by_row(tmp_path / "h.jsonl")
    # every row accounted for: 4 written, row 2's prompt too long, as one engine and the hf backend have it
    counts = [(s["written"], s["failed"]) for s in (two, one, hf)]
    assert counts == [(4, 1)] * 3
    assert two["turns"] == one["turns"] >= 4 and two["generated_tokens"] == one["generated_tokens"] > 0
    st, n = two["backend_stats"], two["turns"]
    assert st["replicas"] == 2 and st["requests"] == n and st["errors"] == 0
    assert sum(st["replica_requests"]) == n and min(st["replica_requests"]) >= 1  # the driver's count ...
    assert [w["requests"] for w in st["worker"]] == st["replica_requests"]      # ... and each worker's own
    assert all(w["steps"] >= 7 for w in st["worker"]) and st["window"] == 256 + 64  # the window is per replica
    assert "replicas" not in one["backend_stats"] and one["backend_stats"]["worker"]["requests"] == n
    # each replica its own log, beside the single engine's name
    assert (tmp_path / "v2.jsonl.vllm.log").is_file() and (tmp_path / "v2.jsonl.vllm-1.log").is_file()
    assert not (tmp_path / "v1.jsonl.vllm-1.log").exists()


def test_cli_flags_reach_every_replicas_llm_and_builds_take_turns(light, target, tmp_path):  # noqa: F811
    from eyas.cli import main

    py, kw = light
    data = tmp_path / "in.json"
    data.write_text(json.dumps([conv(i, 1) for i in range(4)]))
    args = ["regenerate", "--target", str(target), "--data", str(data), "--backend", "vllm", "--python", str(py),
            "--max-new-tokens", "3"]
    assert main([*args, "--out", str(tmp_path / "a.jsonl"), "--engine-replicas", "2",
                 "--engine-async-scheduling"]) == 0
    two = builds(kw)
    assert len(two) == 2 and len((tmp_path / "a.jsonl").read_text().splitlines()) == 4
    assert all(b["kw"]["gpu_memory_utilization"] == 0.45 and b["kw"]["async_scheduling"] is True for b in two)
    a, b = sorted((x["built"] for x in two), key=lambda s: s[0])
    assert a[1] <= b[0]  # one build at a time (vLLM sizes its KV cache from the free memory it measures)
    assert all(x["imported"] < a[1] for x in two)  # but both processes were up before the first build ended
    for p in kw.iterdir():
        p.unlink()
    assert main([*args, "--out", str(tmp_path / "b.jsonl")]) == 0
    (one,) = builds(kw)  # one engine: vLLM's own memory default and scheduling, as before replicas existed
    assert "gpu_memory_utilization" not in one["kw"] and "async_scheduling" not in one["kw"]


def test_worker_settings_and_memory_shares():
    common = dict(dtype="bfloat16", max_model_len=4096, tensor_parallel_size=1, seed=0, max_num_seqs=None)
    assert worker_config("t", **common) == {"model": "t", **{k: v for k, v in common.items() if v is not None}}
    cfg = worker_config("t", **common, gpu_memory_utilization=0.3, async_scheduling=True)
    assert cfg["gpu_memory_utilization"] == 0.3 and cfg["async_scheduling"] is True
    assert [memory_share(n) for n in (1, 2, 3, 4, 7)] == [None, 0.45, 0.3, 0.22, 0.12]  # rounded down
    with pytest.raises(ValueError, match="engine_replicas 91"):
        memory_share(91)
    log = Path("/x/o.jsonl.vllm.log")
    assert replica_log(log, 0) == log and replica_log(log, 2) == Path("/x/o.jsonl.vllm-2.log")
    with pytest.raises(ValueError, match="engine_replicas"):
        RegenerateConfig(target="t", data="x", out="o", engine_replicas=0)


def test_a_dying_replica_stops_the_run_naming_its_log(light, target, tmp_path, monkeypatch):  # noqa: F811
    py, _ = light
    monkeypatch.setenv("FAKE_VLLM_DIE", str(tmp_path / "die.claim"))
    b = VllmBackend(str(target), python=str(py), replicas=2, max_new_tokens=5, log=tmp_path / "vllm.log")
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(6)]
    with pytest.raises(EngineError, match="exited \\(code 7\\)") as err:
        b.generate(prompts)
    named = re.search(r"log (\S+):\n", str(err.value)).group(1)
    assert named in (str(tmp_path / "vllm.log"), str(tmp_path / "vllm-1.log"))
    assert "fell off the bus" in open(named).read() and "fell off the bus" in str(err.value)
    other = ({str(tmp_path / "vllm.log"), str(tmp_path / "vllm-1.log")} - {named}).pop()
    assert "fell off the bus" not in open(other).read()  # the log named is the dead replica's own
    assert all(r.proc.poll() is not None for r in b.replicas)  # the survivor is stopped, not left on the GPU
    b.close()


def test_a_start_a_neighbour_spoiled_starts_once_more(light, target, tmp_path, monkeypatch):  # noqa: F811
    py, kw = light
    monkeypatch.setenv("FAKE_VLLM_SPOILED", str(tmp_path / "spoiled.claim"))
    monkeypatch.setattr("eyas.engines.vllm.VllmAdapter.retry_wait_s", 0.0)
    with pytest.warns(RuntimeWarning, match="starting it once more"):
        b = VllmBackend(str(target), python=str(py), max_new_tokens=3, log=tmp_path / "vllm.log")
    (answer,) = b.generate([[{"role": "user", "content": "hi"}]])
    assert isinstance(answer, tuple) and len(builds(kw)) == 1   # answered by the second start's engine
    b.close()


def test_replicas_with_tensor_parallel_are_refused_before_start(target):  # noqa: F811
    with pytest.raises(EngineError, match="replicas share one GPU"):
        VllmBackend(str(target), python="/nonexistent/python", tensor_parallel_size=2, replicas=2)


def test_the_startup_lock_is_free_once_left_though_a_forked_child_holds_its_descriptor(tmp_path):
    import fcntl

    lock = tmp_path / "startup.lock"
    with exclusive(str(lock)):
        child = os.fork()
        if child == 0:  # vLLM's engine core, forked while the lock is held: it keeps the descriptor open
            import time

            time.sleep(3)
            os._exit(0)
    try:
        with open(lock, "w") as f:  # the next replica's build: the lock must be free now, not when the child ends
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_replicas_whose_engines_fork_both_come_up(light, target, tmp_path, monkeypatch):  # noqa: F811
    py, kw = light
    monkeypatch.setenv("FAKE_VLLM_FORK", "1")
    b = VllmBackend(str(target), python=str(py), replicas=2, max_new_tokens=3, log=tmp_path / "vllm.log",
                    startup_timeout_s=60)
    out = b.generate([[{"role": "user", "content": f"question {i}"}] for i in range(4)])
    b.close()
    assert len(out) == 4 and len(builds(kw)) == 2


def test_engines_that_never_come_up_stop_the_run_naming_their_logs(light, target, tmp_path, monkeypatch):  # noqa: F811
    py, _ = light
    monkeypatch.setenv("FAKE_VLLM_HANG", "1")
    with pytest.raises(EngineError, match="2 of 2 vLLM engine\\(s\\) not up after 2 s") as err:
        VllmBackend(str(target), python=str(py), replicas=2, log=tmp_path / "vllm.log", startup_timeout_s=2)
    assert str(tmp_path / "vllm.log") in str(err.value) and str(tmp_path / "vllm-1.log") in str(err.value)
    for log in ("vllm.log", "vllm-1.log"):   # where each stood: its processes and Python stacks (faulthandler)
        text = (tmp_path / log).read_text()
        assert "[eyas] the worker outlived its bound" in text and "most recent call first" in text
    assert "process(es) in its session, their stacks in the log" in str(err.value)


# An engine whose core process (forked, as vLLM's is) logs its start-up through vLLM's logging stream and then
# never comes up; the front process never returns either.
STALLED = """
import os, sys, time
from vllm.sampling_params import SamplingParams

class LLM:
    def __init__(self, model, **kw):
        stream = sys.stderr if os.environ.get("VLLM_LOGGING_STREAM") == "ext://sys.stderr" else sys.stdout
        if os.fork() == 0:
            stream.write(f"(EngineCore pid={os.getpid()}) INFO compiling the stand-in's kernels\\n")
            stream.flush()
            with open(os.environ["FAKE_CORE_PID"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(3600)
        time.sleep(3600)
"""


def test_a_stalled_start_up_is_in_the_log_while_it_stalls_and_its_core_is_stopped(target, tmp_path, monkeypatch):  # noqa: F811
    import threading
    import time

    py = fake_vllm_python(tmp_path, STALLED)
    monkeypatch.setenv("FAKE_CORE_PID", str(tmp_path / "core.pid"))
    log, err = tmp_path / "vllm.log", []

    def start():
        try:
            VllmBackend(str(target), python=str(py), log=log, startup_timeout_s=8)
        except EngineError as e:
            err.append(e)

    t = threading.Thread(target=start)
    t.start()
    deadline = time.monotonic() + 7
    while "compiling the stand-in" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "compiling the stand-in" in log.read_text() and t.is_alive()  # written as it happened, start-up still on
    t.join(30)
    assert err and "not up after 8 s" in str(err[0]) and "compiling the stand-in" in str(err[0])
    core = int((tmp_path / "core.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(core) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(core)  # the engine core went with its worker: nothing left holding the GPU


def test_eager_and_a_memory_share_reach_the_engines(light, target, tmp_path):  # noqa: F811
    from eyas.cli import main

    py, kw = light
    data = tmp_path / "in.json"
    data.write_text(json.dumps([conv(i, 1) for i in range(2)]))
    args = ["regenerate", "--target", str(target), "--data", str(data), "--backend", "vllm", "--python", str(py),
            "--max-new-tokens", "3", "--graph", "eager", "--gpu-memory-utilization", "0.3"]
    assert main([*args, "--out", str(tmp_path / "a.jsonl")]) == 0
    (one,) = builds(kw)
    assert one["kw"]["enforce_eager"] is True and one["kw"]["gpu_memory_utilization"] == 0.3
    for p in kw.iterdir():
        p.unlink()
    assert main([*args, "--out", str(tmp_path / "b.jsonl"), "--engine-replicas", "2"]) == 0
    assert [b["kw"]["gpu_memory_utilization"] for b in builds(kw)] == [0.15, 0.15]   # the share, split

"""`regenerate --backend vllm` (a long-lived worker in the engine's env) and vLLM's speedup report.

The stand-in `vllm` package generates greedily with transformers on the same tiny model, returning token ids the
way vLLM does (the stop token included), so the vllm backend must reproduce the hf backend's answers exactly.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time

import pytest
import torch

from eyas.data.backends import HFBackend
from eyas.regenerate import RegenerateConfig, regenerate
from eyas.engines.base import EngineError
from eyas.engines.vllm_generate import VllmBackend
from eyas.engines.speedup import measure, summarize
from eyas.engines.vllm import VllmAdapter
from tests.data.templates import make_target_dir
from tests.data.test_regenerate import conv

# vLLM's sampling_params module in miniature: the worker imports RequestOutputKind from it.
FAKE_SAMPLING = '''
class RequestOutputKind:  # an Enum in vLLM
    CUMULATIVE, DELTA, FINAL_ONLY = 0, 1, 2

class SamplingParams:
    def __init__(self, temperature=1.0, top_p=1.0, max_tokens=16, seed=None, stop_token_ids=None, ignore_eos=False,
                 output_kind=RequestOutputKind.CUMULATIVE, detokenize=True):
        self.max_tokens, self.stop, self.output_kind = max_tokens, set(stop_token_ids or []), output_kind
        self.detokenize = detokenize
'''

# vLLM's engine loop in miniature: LLM.llm_engine takes requests with the caller's ids, runs up to max_num_seqs of
# them (the rest wait, first come first served), and each step() advances every running request by one token and
# returns those that finished (FINAL_ONLY), their token ids the way vLLM gives them (the stop token included).
# Tokens: greedy from the tiny model with transformers (the reference answer), or, with $FAKE_VLLM_SCRIPT, a
# scripted answer (see test_vllm_stream.py). With $FAKE_VLLM_EVENTS every add and finish is logged there.
FAKE_VLLM = '''
import json, os, time
from types import SimpleNamespace
import torch
from vllm.sampling_params import RequestOutputKind, SamplingParams
__version__ = "0.26.0"
_SCRIPT = json.loads(os.environ.get("FAKE_VLLM_SCRIPT") or "null")

def _event(**kw):
    if os.environ.get("FAKE_VLLM_EVENTS"):
        with open(os.environ["FAKE_VLLM_EVENTS"], "a") as f:
            f.write(json.dumps({"t": time.time(), **kw}) + "\\n")

class _Engine:
    def __init__(self, model, max_num_seqs, max_num_batched_tokens):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens))
        self.waiting, self.running = [], []
        if _SCRIPT:
            self.tok = AutoTokenizer.from_pretrained(model)
        else:
            self.m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    def add_request(self, request_id, prompt, params):
        assert params.output_kind == RequestOutputKind.FINAL_ONLY and isinstance(request_id, str)
        assert params.detokenize is False    # eyas reads ids only: no per-step detokenization in the engine
        ids = list(prompt["prompt_token_ids"])
        if _SCRIPT:
            text = self.tok.decode(ids)
            if "REFUSE" in text:
                raise ValueError("the stand-in engine refuses this prompt")
            n = _SCRIPT["slow"] if "slow" in text else _SCRIPT["quick"]
            script = [_SCRIPT["word"]] * n + [_SCRIPT["eos"]]
        else:
            script = None
        self.waiting.append(SimpleNamespace(id=request_id, ids=ids, new=[], params=params, script=script))
        _event(ev="add", id=request_id, prompt=ids)

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def _next(self, r):
        if r.script:
            return r.script[len(r.new)]
        with torch.no_grad():
            return int(self.m(torch.tensor([r.ids + r.new])).logits[0, -1].argmax())

    def step(self):
        while self.waiting and len(self.running) < self.vllm_config.scheduler_config.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        if _SCRIPT:
            time.sleep(_SCRIPT["step_s"])
        done = []
        for r in self.running:
            r.new.append(self._next(r))
            if r.new[-1] in r.params.stop or len(r.new) >= r.params.max_tokens:
                done.append(r)
        out = []
        for r in done:
            self.running.remove(r)
            _event(ev="finish", id=r.id, n=len(r.new))
            finish = "stop" if r.new[-1] in r.params.stop else "length"
            c = SimpleNamespace(token_ids=list(r.new), finish_reason=finish, text="<vllm detokenizes differently>")
            out.append(SimpleNamespace(request_id=r.id, outputs=[c], finished=True))
        return out

class LLM:
    def __init__(self, model, **kw):
        assert kw["tensor_parallel_size"] == 1
        self.llm_engine = _Engine(model, kw.get("max_num_seqs") or 256, kw.get("max_num_batched_tokens") or 8192)
'''


def fake_vllm_python(root, source: str, extra_path: str = ""):
    """A `python` whose `import vllm` is the stand-in `source` (and `vllm.sampling_params` FAKE_SAMPLING), like
    a venv with vllm installed."""
    pkg = root / "fakevllm" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(source)
    (pkg / "sampling_params.py").write_text(FAKE_SAMPLING)
    py = root / "python"
    # -P drops the script dir; the wrapper puts the stand-in first.
    py.write_text(f"#!/bin/sh\nPYTHONPATH={pkg.parent}{extra_path} exec {sys.executable} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return py


@pytest.fixture
def engine(tmp_path):
    return fake_vllm_python(tmp_path, FAKE_VLLM, os.pathsep + os.pathsep.join(sys.path[1:]))


@pytest.fixture
def target(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    d = make_target_dir(tmp_path / "tiny")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d)).save_pretrained(d)
    return d


def test_vllm_backend_answers_equal_hf_backend(engine, target, tmp_path):
    rows = [conv(0, 1), conv(1, 3), conv(2, 2, tag="x" * 400), conv(4, 1)]
    data = tmp_path / "in.json"
    data.write_text(json.dumps(rows))
    common = dict(target=str(target), data=str(data), max_new_tokens=7, max_prompt_tokens=300)
    vb = regenerate(RegenerateConfig(**common, out=tmp_path / "v.jsonl", backend="vllm", python=str(engine)))
    from eyas.target.load import load_target

    t = load_target(str(target), dtype=torch.float32, device="cpu")
    hb = regenerate(RegenerateConfig(**common, out=tmp_path / "h.jsonl"),
                    backend=HFBackend(str(target), model=t.model, tokenizer=t.tokenizer, device="cpu",
                                      max_new_tokens=7, max_prompt_tokens=300, batch_size=1))
    assert vb["written"] == hb["written"] >= 2 and vb["failed"] == hb["failed"] >= 1  # row 2: prompt too long
    by_row = lambda p: {r["row"]: r for r in map(json.loads, p.read_text().splitlines())}  # noqa: E731
    # rows are written as they finish (continuous batching), so the same rows in another order
    assert by_row(tmp_path / "v.jsonl") == by_row(tmp_path / "h.jsonl")
    assert vb["generated_tokens"] == hb["generated_tokens"] > 0  # the same tokens counted the same way
    st = vb["backend_stats"]  # one engine request per answered turn; the window held them all at once
    assert st["requests"] == vb["turns"] and st["errors"] == 0 and st["engine_s"] > 0 and st["tok_s"] > 0
    assert st["engine_max_seqs"] == 256 and st["window"] == 256 + 64
    assert st["engine_max_batched_tokens"] == 8192  # the engine's own, as its ready message reports it
    assert 1 <= st["in_flight_mean"] <= st["in_flight_max"] <= 3
    assert st["worker"]["steps"] >= 7 and st["worker"]["in_flight_per_step"] >= 1
    loads = st["worker"]["by_load"]    # every step in one quarter of the peak load
    assert sum(b["steps"] for b in loads) == st["worker"]["steps"] and all(b["seconds"] >= 0 for b in loads)
    errs = [json.loads(x) for x in (tmp_path / "v.jsonl.errors.jsonl").read_text().splitlines()]
    assert [e["row"] for e in errs] == [2] and re.fullmatch(r"prompt_too_long: \d+ tokens > 300", errs[0]["error"])


def test_worker_groups_steps_by_load():
    import importlib.util

    from eyas.engines.vllm_generate import WORKER

    spec = importlib.util.spec_from_file_location("vllm_generate_worker", WORKER)
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    # a full window of 100 for 2 steps of 0.1 s, then a tail of 1-2 requests for 4 steps of 0.01 s
    loads = w.by_load([(100, 0.1), (96, 0.1), (2, 0.01), (1, 0.01), (1, 0.01), (1, 0.01)])
    assert [(b["in_flight"], b["steps"]) for b in loads] == [([1, 25], 4), ([76, 100], 2)]
    assert loads[1]["in_flight_per_step"] == 98.0 and loads[1]["in_flight_per_s"] == 980.0
    assert loads[0]["seconds"] == 0.04 and loads[0]["in_flight_per_s"] == 125.0
    assert w.by_load([]) == []


def test_vllm_backend_worker_crash_is_an_engine_error(tmp_path):
    from eyas.engines.base import EngineError

    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho 'vllm: CUDA out of memory' >&2\nexit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    tok = type("T", (), {"eos_token_id": 2})()
    with pytest.raises(EngineError, match="CUDA out of memory"):
        VllmBackend("t", python=str(py), tokenizer=tok, stop_ids=[2], log=tmp_path / "log")


# Records what the generation worker builds its LLM with, then serves nothing.
RECORDING_VLLM = """
import json, os
from types import SimpleNamespace
from vllm.sampling_params import SamplingParams
class LLM:
    def __init__(self, model, **kw):
        json.dump({"model": model, **kw}, open(os.environ["FAKE_VLLM_KW"], "w"))
        seqs = SimpleNamespace(max_num_seqs=kw.get("max_num_seqs", 256),
                               max_num_batched_tokens=kw.get("max_num_batched_tokens", 8192))
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=seqs))
"""


def test_engine_max_seqs_flag_reaches_vllms_llm_only_when_given(target, tmp_path, monkeypatch):
    """--engine-max-seqs -> RegenerateConfig -> the worker config the driver writes -> LLM(max_num_seqs=...);
    unset, the worker passes nothing and vLLM keeps its own default (it depends on the GPU). The in-flight window
    follows what the engine reports, unless --engine-in-flight sets it."""
    import argparse

    from eyas.config import add_config_args, build_config
    from eyas.regenerate import vllm_backend
    from eyas.engines.vllm_generate import worker_config

    parser = argparse.ArgumentParser()
    add_config_args(parser, RegenerateConfig)
    py = fake_vllm_python(tmp_path, RECORDING_VLLM)
    monkeypatch.setenv("FAKE_VLLM_KW", str(tmp_path / "kw.json"))
    seen, windows = [], []
    for extra in (["--engine-max-seqs", "2048"], [], ["--engine-in-flight", "5"]):
        args = ["--target", str(target), "--data", "x", "--out", str(tmp_path / "o.jsonl"), "--backend", "vllm",
                "--python", str(py), *extra]
        backend = vllm_backend(build_config(RegenerateConfig, parser.parse_args(args)))
        backend.close()
        seen.append(json.loads((tmp_path / "kw.json").read_text()))
        windows.append((backend.engine_max_seqs, backend.window))
    assert seen[0]["max_num_seqs"] == 2048 and "max_num_seqs" not in seen[1]
    assert windows == [(2048, 2048 + 512), (256, 256 + 64), (256, 5)]  # the engine's own 256 when unset
    assert seen[0]["model"] == str(target) and seen[0]["tensor_parallel_size"] == 1
    common = dict(dtype="bfloat16", max_model_len=4096, tensor_parallel_size=1, seed=0)
    assert worker_config("t", **common, max_num_seqs=None) == {"model": "t", **common}
    with pytest.raises(ValueError, match="engine_max_seqs"):
        RegenerateConfig(target="t", data="x", out=tmp_path / "o", engine_max_seqs=0)


def test_engine_max_batched_tokens_flag_reaches_vllms_llm_only_when_given(target, tmp_path, monkeypatch):
    """--engine-max-batched-tokens -> RegenerateConfig -> the worker config -> LLM(max_num_batched_tokens=...);
    unset, vLLM keeps its own budget, and either way the backend reports what the engine settled on."""
    import argparse

    from eyas.config import add_config_args, build_config
    from eyas.regenerate import vllm_backend
    from eyas.engines.vllm_generate import worker_config

    parser = argparse.ArgumentParser()
    add_config_args(parser, RegenerateConfig)
    py = fake_vllm_python(tmp_path, RECORDING_VLLM)
    monkeypatch.setenv("FAKE_VLLM_KW", str(tmp_path / "kw.json"))
    seen, reported = [], []
    for extra in (["--engine-max-batched-tokens", "32768"], []):
        args = ["--target", str(target), "--data", "x", "--out", str(tmp_path / "o.jsonl"), "--backend", "vllm",
                "--python", str(py), *extra]
        backend = vllm_backend(build_config(RegenerateConfig, parser.parse_args(args)))
        backend.close()
        seen.append(json.loads((tmp_path / "kw.json").read_text()))
        reported.append(backend.engine_max_batched_tokens)
    assert seen[0]["max_num_batched_tokens"] == 32768 and "max_num_batched_tokens" not in seen[1]
    assert "max_num_seqs" not in seen[0]  # one knob does not set the other
    assert reported == [32768, 8192]  # the engine's own 8192 when unset
    common = dict(dtype="bfloat16", max_model_len=4096, tensor_parallel_size=1, seed=0, max_num_seqs=None)
    assert worker_config("t", **common, max_num_batched_tokens=4096)["max_num_batched_tokens"] == 4096
    assert "max_num_batched_tokens" not in worker_config("t", **common)
    with pytest.raises(ValueError, match="engine_max_batched_tokens"):
        RegenerateConfig(target="t", data="x", out=tmp_path / "o", engine_max_batched_tokens=0)


def run(b, seconds, outputs, metrics=None):
    return {"batch_size": b, "seconds": seconds, "generated_tokens": sum(map(len, outputs)), "outputs": outputs,
            "counters": metrics or {}}


def test_speedup_summary_from_vllm_counters():
    out = [[1, 2, 3, 4]] * 4
    base = {"runs": [run(1, 2.0, out), run(8, 1.0, out)]}
    m = {"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_accepted_tokens": 15,
         "vllm:spec_decode_num_accepted_tokens_per_pos": [8, 5, 2]}
    spec = {3: {"runs": [run(1, 1.0, out, m), run(8, 1.25, out[:3] + [[1, 2, 9, 9]], m)]},
            1: {"runs": [run(1, 1.6, out, {"vllm:spec_decode_num_drafts": 4,
                                           "vllm:spec_decode_num_accepted_tokens": 2,
                                           "vllm:spec_decode_num_accepted_tokens_per_pos": [2]}),
                         run(8, 0.9, out)]}}
    s = summarize(base, spec, VllmAdapter.spec_stats)
    k3b1 = next(r for r in s["rows"] if r["chain"] == 3 and r["batch_size"] == 1)
    assert k3b1["speedup"] == pytest.approx(2.0) and k3b1["tau"] == pytest.approx(2.5)
    assert k3b1["accept_per_position"] == pytest.approx([0.8, 0.5, 0.2]) and k3b1["identical_to_base"] == "4/4"
    k3b8 = next(r for r in s["rows"] if r["chain"] == 3 and r["batch_size"] == 8)
    assert k3b8["identical_to_base"] == "3/4"
    assert s["best_by_batch"]["1"]["chain"] == 3 and s["best_by_batch"]["8"]["chain"] == 1
    assert VllmAdapter.spec_stats({}).tau is None  # no drafts: no τ, not a division by zero
    assert s["base_tok_s"] == {"1": 8.0, "8": 16.0}
    # the base's engine failed or has not finished: tokens/s, no speedups
    alone = summarize(None, {3: spec[3]}, VllmAdapter.spec_stats)
    assert [r["tok_s"] for r in alone["rows"]] == [16.0, 12.8] and alone["rows"][0]["tau"] == pytest.approx(2.5)
    assert not any("speedup" in r for r in alone["rows"]) and alone["best_by_batch"] == {} and not alone["base_tok_s"]


def test_tensor_parallel_that_vllm_would_refuse_is_named_before_start():
    from types import SimpleNamespace

    from eyas.engines.vllm import tensor_parallel_problem

    smol = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3)  # SmolLM2-135M
    assert "9 attention heads" in tensor_parallel_problem(smol, 2)
    assert tensor_parallel_problem(smol, 3) is None and tensor_parallel_problem(smol, 1) is None
    assert tensor_parallel_problem(SimpleNamespace(num_attention_heads=8, num_key_value_heads=4), 2) is None
    assert tensor_parallel_problem(SimpleNamespace(num_attention_heads=32, num_key_value_heads=8), 16) is None  # kv replicated
    assert "KV heads" in tensor_parallel_problem(SimpleNamespace(num_attention_heads=12, num_key_value_heads=6), 4)


def test_regenerate_vllm_tp_refused_before_engine_starts(target, tmp_path):
    from eyas.engines.base import EngineError

    # the tiny target has 4 heads: tp 3 cannot split them; no engine python is even looked up
    with pytest.raises(EngineError, match="4 attention heads"):
        VllmBackend(str(target), python="/nonexistent/python", tensor_parallel_size=3)


FAKE_SERVING_VLLM = """
__version__ = "0.26.0"
class SamplingParams:
    def __init__(self, temperature=1.0, max_tokens=16, ignore_eos=False, logprobs=None):
        self.max_tokens, self.logprobs = max_tokens, logprobs
class _LP:
    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank
def _top(t):  # vLLM's {id: Logprob} for one token: a runner-up tied with it, listed first, and a third
    return {t + 100: _LP(-0.5, 2), t: _LP(-0.5, 1), t + 200: _LP(-2.0, 3)}
class _M:
    def __init__(self, name, value):
        self.name, self.value = name, value
class _V:
    def __init__(self, name, values):
        self.name, self.values = name, values
class _Cfg:
    speculative_config = None
    class model_config:
        model = "t"
class LLM:
    def __init__(self, model, **kw):
        self.kw, self.n = kw, 0
        self.llm_engine = type("E", (), {"vllm_config": _Cfg()})()
    def generate(self, prompts, params, use_tqdm=True):
        self.n += len(prompts)  # one draft per request, one accepted token at position 0
        out = [list(p["prompt_token_ids"][:params.max_tokens]) for p in prompts]
        return [type("R", (), {"outputs": [type("O", (), {"token_ids": ids, "logprobs": [_top(t) for t in ids]
                                                          if params.logprobs else None})()]})() for ids in out]
    def get_metrics(self):
        return [_M("vllm:spec_decode_num_drafts", self.n), _M("vllm:spec_decode_num_accepted_tokens", self.n),
                _V("vllm:spec_decode_num_accepted_tokens_per_pos", [self.n, 0]), _M("vllm:other", 7)]
"""


def test_serve_worker_serves_and_benches_with_counter_deltas(tmp_path):
    from eyas.engines.base import run_in_env

    py = fake_vllm_python(tmp_path, FAKE_SERVING_VLLM)
    WORKER = VllmAdapter.worker
    req = {"engine": {"draft": None, "kwargs": {"model": "t"}}, "prompts": [[1, 2, 3], [4, 5], [6]], "max_tokens": 2}
    served = run_in_env(py, WORKER, req)  # serve-check's shape
    assert served["outputs"] == [[1, 2], [4, 5], [6]] and served["counters"]["vllm:spec_decode_num_drafts"] == 3
    assert "vllm:other" not in served["counters"] and served["speculative_config"] is None
    assert "logprobs" not in served  # only when asked
    lps = run_in_env(py, WORKER, {**req, "logprobs": 2})["logprobs"]
    # per prompt, per token, best first; on equal logprobs vLLM's own token (rank 1) leads
    assert [len(x) for x in lps] == [2, 2, 1] and lps[1][0] == [[4, -0.5], [104, -0.5], [204, -2.0]]
    runs = run_in_env(py, WORKER, {**req, "batch_sizes": [1, 2], "measure_lock": str(tmp_path / "lock")})["runs"]
    assert [r["batch_size"] for r in runs] == [1, 2] and all(r["requests"] == 3 for r in runs)
    # deltas per run: the warm-up's 2 requests and the first run's 3 are not counted again
    assert [r["counters"]["vllm:spec_decode_num_drafts"] for r in runs] == [3, 3]
    assert runs[1]["counters"]["vllm:spec_decode_num_accepted_tokens_per_pos"] == [3, 0]
    assert runs[0]["generated_tokens"] == 5 and VllmAdapter.spec_stats(runs[0]["counters"]).tau == 2.0


# The serving stand-in, timed: its start-up sleeps (per model, so a missing barrier shows), a model may fail to
# start, and every construction and generate call is logged with wall-clock times to the file $FAKE_VLLM names.
FAKE_TIMED_VLLM = FAKE_SERVING_VLLM + """
import json, os, time
_Serving = LLM
_CFG = json.loads(os.environ["FAKE_VLLM"])

def _event(what, **kw):
    with open(_CFG["events"], "a") as f:
        f.write(json.dumps({"what": what, "pid": os.getpid(), "t": time.time(), **kw}) + "\\n")

class LLM(_Serving):
    def __init__(self, model, **kw):
        name = os.path.basename(model)
        _event("init_start", model=name, util=kw["gpu_memory_utilization"], kv=kw.get("kv_cache_memory_bytes"))
        time.sleep(_CFG["startup"].get(name, 0))
        if _CFG.get("fail") in (model, name):
            raise RuntimeError("CUDA out of memory (stand-in)")
        super().__init__(model, **kw)
        _event("init_end")
    def generate(self, prompts, params, use_tqdm=True):
        _event("gen_start")
        time.sleep(0.02)
        try:
            return super().generate(prompts, params, use_tqdm)
        finally:
            _event("gen_end")
"""


def timed_engine(tmp_path, monkeypatch, startup: dict, fail: str | None = None):
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"events": str(tmp_path / "events.jsonl"), "startup": startup,
                                                "fail": fail}))
    return fake_vllm_python(tmp_path, FAKE_TIMED_VLLM)


def model_dirs(root, chains) -> tuple[str, str]:
    """test_vllm_speedup's models, named as the fake engine's start-up table keys them (base, k1, k2, ...)."""
    from tests.engines.test_vllm_speedup import write_models

    return write_models(root, chains, target="base", export="k")


def engine_spans(events_file) -> dict:
    """model -> {"util", "kv", "init": (start, end), "timed": (first generate start, last generate end)}."""
    events = [json.loads(x) for x in events_file.read_text().splitlines()]
    model = {e["pid"]: e["model"] for e in events if e["what"] == "init_start"}
    spans = {}
    for e in events:
        s = spans.setdefault(model[e["pid"]], {"init": [None, None], "timed": [None, None]})
        kind, i = {"init_start": ("init", 0), "init_end": ("init", 1), "gen_start": ("timed", 0),
                   "gen_end": ("timed", 1)}[e["what"]]
        if s[kind][i] is None or i == 1:  # the first start, the last end
            s[kind][i] = e["t"]
        s["util"], s["kv"] = e.get("util", s.get("util")), e.get("kv", s.get("kv"))
    return spans


def overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_speedup_engines_share_a_gpu_start_together_and_time_alone(tmp_path, monkeypatch):
    # wave 1 = base, K=1, K=2 (3 per GPU); wave 2 = K=3. The base starts slowest: without the barrier K=1 would
    # time while the base still starts; without the lock the wave's three would time together.
    startup = {"base": 0.6, "k1": 0.1, "k2": 0.3, "k3": 0.2}
    py = timed_engine(tmp_path, monkeypatch, startup)
    seen = []
    res = measure(VllmAdapter(py), *model_dirs(tmp_path, [1, 2, 3]), [[1, 2, 3], [4, 5], [6]], [1, 2, 3], [1, 2], 2,
                  ["0"], tmp_path / "logs", engines_per_gpu=3, on_result=lambda name, doc: seen.append(name))
    assert sorted(seen) == ["base", "k1", "k2", "k3"] and not res["failed"]
    spans = engine_spans(tmp_path / "events.jsonl")
    assert sorted(spans) == sorted(startup) and all(s["util"] == pytest.approx(0.85 / 3) for s in spans.values())
    # each engine got its explicit KV size (the draft's layer makes the K engines' larger), and the report says so
    assert 0 < spans["base"]["kv"] < spans["k1"]["kv"] == spans["k3"]["kv"]
    assert {n: d["kv_cache_memory_bytes"] for n, d in res["engines"].items()} == {n: s["kv"] for n, s in spans.items()}
    assert spans["k1"]["init"][1] > spans["base"]["init"][0]  # start-ups of a wave overlap (not one after another)
    for a in spans:
        for b in spans:
            if a != b:
                assert not overlap(spans[a]["timed"], spans[b]["timed"]), (a, b)
                assert not overlap(spans[a]["timed"], spans[b]["init"]), (a, b)
    assert {r["chain"] for r in res["rows"]} == {1, 2, 3} and all(r["speedup"] > 0 for r in res["rows"])
    e = res["engines"]
    assert all(e[n]["measure_s"] > 0 and e[n]["startup_s"] >= startup[n] and e[n]["barrier_timed_out"] is False
               for n in startup)
    assert e["k1"]["wait_s"] >= 0.4  # waited for the base to be up
    assert res["sweep_s"] >= max(d["wall_s"] for d in e.values())


def test_speedup_rounds_take_turns_and_report_the_fastest(tmp_path, monkeypatch):
    py = timed_engine(tmp_path, monkeypatch, {"base": 0.2, "k1": 0.1})
    res = measure(VllmAdapter(py), *model_dirs(tmp_path, [1]), [[1, 2, 3], [4, 5], [6]], [1], [1, 2], 2, ["0"],
                  tmp_path / "logs", engines_per_gpu=2, rounds=2)
    assert not res["failed"] and all(e["rounds"] == 2 for e in res["engines"].values())
    for row in res["rows"]:   # the fastest of the two rounds is the one reported
        assert len(row["round_tok_s"]) == 2 and row["tok_s"] == pytest.approx(max(row["round_tok_s"]))
    assert all(res["base_tok_s"][b] == pytest.approx(max(v)) for b, v in res["base_round_tok_s"].items())
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    calls = {}  # pid -> [(start, end)] of its generate calls
    for e in events:
        if e["what"] in ("gen_start", "gen_end"):
            calls.setdefault(e["pid"], []).append(e["t"])
    spans = {pid: list(zip(t[::2], t[1::2])) for pid, t in calls.items()}
    # warm-up (one call per batch size) + 2 rounds x (3 prompts at batch 1 + 2 calls at batch 2) per engine
    assert sorted(len(v) for v in spans.values()) == [2 + 2 * (3 + 2)] * 2
    a, b = spans.values()
    assert not any(overlap(x, y) for x in a for y in b)  # never two engines timing at once
    # round by round: some call of each engine lies between two calls of the other (they took turns)
    assert any(a[0][0] < y[0] < a[-1][1] for y in b) or any(b[0][0] < x[0] < b[-1][1] for x in a)


def test_speedup_engines_start_at_once_but_time_only_after_the_start_file(tmp_path, monkeypatch):
    """start_after (an eval sharing the GPU finishes first): the engines start up meanwhile, and no generate call,
    warm-up included, comes before the file exists."""
    import threading

    py = timed_engine(tmp_path, monkeypatch, {"base": 0.1, "k1": 0.1})
    flag, touched = tmp_path / "evals.done", []
    timer = threading.Timer(2.0, lambda: (touched.append(time.time()), flag.touch()))
    timer.start()
    res = measure(VllmAdapter(py), *model_dirs(tmp_path, [1]), [[1, 2, 3], [4, 5]], [1], [1], 2, ["0"],
                  tmp_path / "logs", engines_per_gpu=2, start_after=str(flag))
    timer.join()
    assert not res["failed"]
    spans = engine_spans(tmp_path / "events.jsonl")
    assert all(s["init"][1] < touched[0] <= s["timed"][0] for s in spans.values()), (touched, spans)
    assert all(e["start_after_s"] > 0.5 and e["start_after_timed_out"] is False for e in res["engines"].values())


def test_speedup_engine_failing_at_start_does_not_hold_up_its_wave(tmp_path, monkeypatch):
    py = timed_engine(tmp_path, monkeypatch, {"base": 0.3, "k1": 0.1}, fail="k2")
    t0 = time.monotonic()
    res = measure(VllmAdapter(py), *model_dirs(tmp_path, [1, 2]), [[1, 2, 3], [4, 5]], [1, 2], [1], 2, ["0"],
                  tmp_path / "logs", engines_per_gpu=3, barrier_timeout_s=120)
    assert time.monotonic() - t0 < 60  # far from the barrier's timeout
    assert list(res["failed"]) == ["k2"] and "CUDA out of memory (stand-in)" in res["failed"]["k2"]
    assert [r["chain"] for r in res["rows"]] == [1] and res["rows"][0]["speedup"] > 0
    assert res["engines"]["base"]["barrier_timed_out"] is False and res["engines"]["k1"]["barrier_timed_out"] is False


def test_speedup_bench_writes_partial_results_after_each_engine(target, tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_vllm_speedup",
                                                  Path(__file__).resolve().parents[2] / "bench" / "vllm_speedup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"Say {c} {i}."]}) + "\n"
                             for i, c in enumerate(["math", "code", "math"])))
    export = str(tmp_path / "export-k{k}")
    py = timed_engine(tmp_path, monkeypatch, {}, fail=export.format(k=1))
    out, snapshots, real_measure = tmp_path / "speedup.json", [], mod.measure

    def spy(*args, on_result, **kw):  # what --out holds right after each engine's callback
        def seen(name, doc):
            on_result(name, doc)
            snapshots.append((name, json.loads(out.read_text())))
        return real_measure(*args, on_result=seen, **kw)

    monkeypatch.setattr(mod, "measure", spy)
    rc = mod.main(["--target", str(target), "--export", export, "--python", str(py), "--bench", str(bench),
                   "--per-category", "2", "--chains", "1", "2", "--batch-sizes", "1", "2", "--max-new-tokens", "3",
                   "--out", str(out)])
    assert rc == 1  # K=1's engine failed
    assert [name for name, _ in snapshots] == ["base", "k1", "k2"]
    assert all(doc["complete"] is False and doc["prompts"] == 3 for _, doc in snapshots)
    after_base, after_k1, after_k2 = (doc for _, doc in snapshots)
    assert after_base["rows"] == [] and set(after_base["base_tok_s"]) == {"1", "2"} and not after_base["failed"]
    assert "CUDA out of memory" in after_k1["failed"]["k1"] and after_k1["rows"] == []
    assert [r["chain"] for r in after_k2["rows"]] == [2, 2] and set(after_k2["best_by_batch"]) == {"1", "2"}
    final = json.loads(out.read_text())
    assert final["complete"] is True and final["rows"] == after_k2["rows"] and list(final["failed"]) == ["k1"]
    assert final["sweep_s"] > 0 and set(final["engines"]) == {"base", "k1", "k2"}


def test_text_only_flag_reaches_vllms_llm_as_language_model_only(target, tmp_path, monkeypatch):
    """--text-only -> RegenerateConfig -> the worker config -> LLM(language_model_only=True); unset, not passed
    (vLLM keeps every modality of a wrapped target); serve-check's engine request and the extraction payload the
    same; SGLang refuses it in one line."""
    import argparse

    from eyas.config import add_config_args, build_config
    from eyas.engines.sglang import SglangAdapter
    from eyas.engines.vllm import VllmAdapter
    from eyas.regenerate import vllm_backend

    parser = argparse.ArgumentParser()
    add_config_args(parser, RegenerateConfig)
    py = fake_vllm_python(tmp_path, RECORDING_VLLM)
    monkeypatch.setenv("FAKE_VLLM_KW", str(tmp_path / "kw.json"))
    seen = []
    for extra in (["--text-only"], []):
        args = ["--target", str(target), "--data", "x", "--out", str(tmp_path / "o.jsonl"), "--backend", "vllm",
                "--python", str(py), *extra]
        vllm_backend(build_config(RegenerateConfig, parser.parse_args(args))).close()
        seen.append(json.loads((tmp_path / "kw.json").read_text()))
    assert seen[0]["language_model_only"] is True and "language_model_only" not in seen[1]
    request = VllmAdapter.engine_request
    assert request(None, "t", None, None, dtype="bf16", max_model_len=64, text_only=True)["kwargs"][
        "language_model_only"] is True
    assert "language_model_only" not in request(None, "t", None, None, dtype="bf16", max_model_len=64)["kwargs"]
    with pytest.raises(EngineError, match="--text-only is vLLM's language_model_only"):
        SglangAdapter.engine_request(None, "t", None, None, dtype="bf16", max_model_len=64, text_only=True)

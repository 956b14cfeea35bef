"""The vLLM adapter's signature probe: recorded release signatures, the AST recorder, a fake engine env."""

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from eyas.engines.base import EngineError
from eyas.engines.entry_points import SIGNATURES_DIR
from eyas.engines.signatures import record as rec
from eyas.engines.vllm import (ENTRY_POINTS, HOW_TO_CREATE, KIMI_K25, TESTED_VERSIONS, VllmAdapter, check_signatures,
                               entry_points_for, load_recorded, version_status)

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location("fake_engine", DATA / "fake_engine.py")
fake_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_engine)

REAL_VLLM = Path(os.environ.get("EYAS_VLLM_PYTHON", "/work/vllm-venv/bin/python"))


def failing(results):
    return {r.entry_point: r.detail for r in results if not r.ok}


# --- recorded releases (read from vLLM's source at each tag by eyas.engines.signatures.record)

def test_tested_release_passes_every_entry_point():
    doc = load_recorded(TESTED_VERSIONS[0])
    assert set(doc["signatures"]) == {ep.name for ep in ENTRY_POINTS}, "re-record after changing ENTRY_POINTS"
    assert failing(check_signatures(doc["signatures"])) == {}


def test_newer_release_still_binds():
    assert failing(check_signatures(load_recorded("0.33.0")["signatures"])) == {}


def test_gpu_release_binds():
    # 0.26.0: the newest vLLM whose wheel pins torch 2.11 (the H200 stack); recorded from its wheel's source.
    doc = load_recorded("0.26.0")
    assert set(doc["signatures"]) == {ep.name for ep in ENTRY_POINTS}, "re-record after changing ENTRY_POINTS"
    assert failing(check_signatures(doc["signatures"])) == {}


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0"])
def test_tested_releases_serve_a_kimi_k25_target(version):
    # The wrapper class with its EAGLE-3 aux hook, its DeepSeek-V2 text model, the registries reading its config.
    sigs = load_recorded(version)["signatures"]
    assert failing(check_signatures(sigs, entry_points_for(KIMI_K25))) == {}
    assert "KimiK25ForConditionalGeneration" in sigs["vllm.model_executor.models.registry._MULTIMODAL_MODELS"]["values"]


def test_old_release_drift_is_caught_and_named():
    bad = failing(check_signatures(load_recorded("0.10.1")["signatures"]))
    algos = "vllm.transformers_utils.configs.speculators.algos.update_eagle3"
    conn = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector."
    assert set(bad) == {algos, "vllm.config.speculative.SpeculativeMethod",
                        "vllm.transformers_utils.configs.speculators.base.SpeculatorsConfig"
                        ".extract_vllm_speculative_config",
                        conn + "ExampleHiddenStatesConnector", conn + "PendingSave", conn + "extract_from_kv_cache",
                        conn + "ExampleHiddenStatesConnector._submit_async_write",
                        "vllm.LLM.__init__", "vllm.engine.arg_utils.EngineArgs"}
    # 0.10.1 had no explicit KV size (the speedup bench's side-by-side engines pass one)
    assert "`kv_cache_memory_bytes`" in bad["vllm.LLM.__init__"] and "max_num_seqs" not in bad["vllm.LLM.__init__"]
    # 0.10.1 named update_eagle3's second parameter vllm_config; 0.32 renamed it pre_trained_config.
    assert "`vllm_config`" in bad[algos] and "pre_trained_config" in bad[algos]
    assert "extract_hidden_states" in bad["vllm.config.speculative.SpeculativeMethod"]
    assert bad[conn + "extract_from_kv_cache"].startswith("absent")


def test_middle_release_lacks_the_connector_internals_eyas_subclasses():
    bad = failing(check_signatures(load_recorded("0.20.0")["signatures"]))
    conn = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector."
    assert set(bad) == {conn + "ExampleHiddenStatesConnector", conn + "PendingSave",
                        conn + "ExampleHiddenStatesConnector._submit_async_write"}
    # 0.20's reference connector exists, but not the write path eyas_connector overrides.
    assert "_submit_async_write" in bad[conn + "ExampleHiddenStatesConnector"]
    assert "_kv_cache" in bad[conn + "ExampleHiddenStatesConnector"]


def test_every_recorded_release_covers_every_entry_point():
    for path in sorted(SIGNATURES_DIR.glob("vllm-*.json")):
        doc = json.loads(path.read_text())
        assert set(doc["signatures"]) == {ep.name for ep in ENTRY_POINTS}, f"re-record {path.name}"


def test_kimi_k25_target_drift_by_release():
    kimi = {v: failing(check_signatures(load_recorded(v)["signatures"], entry_points_for(KIMI_K25)))
            for v in ("0.10.1", "0.20.0", "0.33.0")}
    assert kimi["0.33.0"] == {}
    own = {ep.name for ep in entry_points_for(KIMI_K25)} - {ep.name for ep in entry_points_for()}
    assert own <= set(kimi["0.10.1"])   # no Kimi-K2.5 in vLLM yet, nor aux capture in DeepSeek-V2
    # 0.20 built the wrapper but read its image processor through remote code, not the fused processor
    assert set(kimi["0.20.0"]) & own == {"vllm.transformers_utils.processors.kimi_k25_vision_fused."
                                         "KimiK25FusedVisionProcessor"}


def test_parallel_drafters_by_release():
    both = entry_points_for(drafters=("p-eagle", "dflash"))
    for v in ("0.26.0", "0.32.0", "0.33.0"):
        assert failing(check_signatures(load_recorded(v)["signatures"], both)) == {}, v
    bad = failing(check_signatures(load_recorded("0.20.0")["signatures"], both))
    peagle = "vllm.transformers_utils.configs.speculators.algos.update_peagle"
    assert peagle in bad and "PeagleLlamaForCausalLM" in bad["vllm.model_executor.models.registry."
                                                              "_SPECULATIVE_DECODING_MODELS[p-eagle]"]
    assert not any("dflash" in name for name in bad)   # 0.20 has DFlash's signatures; its meaning differs:
    assert VllmAdapter.drafter_since["dflash"][0] == "0.26.0"
    old = failing(check_signatures(load_recorded("0.10.1")["signatures"], both))
    assert {peagle, "vllm.transformers_utils.configs.speculators.algos.update_dflash",
            "vllm.config.speculative.SpeculativeMethod[dflash]"} <= set(old)


def test_unknown_release_recording_names_the_known_ones():
    with pytest.raises(FileNotFoundError, match="0.32.0"):
        load_recorded("9.9.9")


# --- the judge on hand-made drift

def _sigs():
    return json.loads(json.dumps(load_recorded("0.32.0")["signatures"]))


def test_kwarg_dropped_from_forward_target_fails_llm_init():
    sigs = _sigs()
    ea = sigs["vllm.engine.arg_utils.EngineArgs"]
    ea["params"] = [p for p in ea["params"] if p[0] != "speculative_config"]
    bad = failing(check_signatures(sigs))
    assert "speculative_config" in bad["vllm.LLM.__init__"] and "EngineArgs" in bad["vllm.LLM.__init__"]
    assert "speculative_config" in bad["vllm.engine.arg_utils.EngineArgs"]


def test_new_required_parameter_and_keyword_turned_positional_only():
    sigs = _sigs()
    sigs["vllm.SamplingParams"]["params"].append(["mode", "KEYWORD_ONLY", False])
    gen = sigs["vllm.LLM.generate"]["params"]
    sigs["vllm.LLM.generate"]["params"] = [[n, "POSITIONAL_ONLY" if n == "use_tqdm" else k, d] for n, k, d in gen]
    bad = failing(check_signatures(sigs))
    assert "requires `mode`" in bad["vllm.SamplingParams"]
    assert "`use_tqdm` is now positional_only" in bad["vllm.LLM.generate"]


def test_metric_fields_are_read_not_constructed():
    sigs = _sigs()
    assert "vllm.v1.metrics.reader.Counter" not in failing(check_signatures(sigs))  # required `labels` is fine
    sigs["vllm.v1.metrics.reader.Vector"]["params"] = [["name", "POSITIONAL_OR_KEYWORD", False]]
    assert "`values`" in failing(check_signatures(sigs))["vllm.v1.metrics.reader.Vector"]


def test_version_matrix():
    assert version_status("0.32.0")[0] == "pass"
    status, detail = version_status("0.40.1")
    assert status == "warn" and "0.32.0" in detail
    assert version_status(None)[0] == "fail"


# --- the AST recorder and the live probe agree (on a fake vllm we may import)

def test_recorder_matches_live_probe_on_fake_engine(tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path)
    recorded = rec.record(tmp_path / "src", "0.32.0")["signatures"]
    # also a Kimi-K2.5 target's (registry tables, the wrapper class) and the parallel drafters' (updaters, classes)
    live = VllmAdapter(py, architectures=KIMI_K25, drafters=("p-eagle", "dflash"))
    assert live.version() == "0.32.0"  # from the module's __version__: the fake has no dist metadata
    live_sigs = live._probe_report()["signatures"]
    assert set(live_sigs) == set(recorded)
    for name, sig in live_sigs.items():
        assert {k: v for k, v in recorded[name].items() if k != "file"} == sig, name
    assert failing(live.probe()) == {}


def test_recorder_reports_absent_and_overload_implementation(tmp_path):
    fake_engine.make_fake_vllm(tmp_path, replace={
        ("vllm/transformers_utils/configs/speculators/algos.py", "def update_eagle3"): "def update_eagle_three"})
    sigs = rec.record(tmp_path / "src", "x")["signatures"]
    assert "missing" in sigs["vllm.transformers_utils.configs.speculators.algos.update_eagle3"]
    gen = [p[0] for p in sigs["vllm.LLM.generate"]["params"]]
    assert gen[:3] == ["self", "prompts", "sampling_params"]  # the implementation, not the @overload stub
    assert sigs["vllm.config.speculative.SpeculativeMethod"]["values"] == [
        "ngram", "draft_model", "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash"]
    with pytest.raises(FileNotFoundError, match="vllm/"):
        rec.SourceTree(tmp_path)


def test_fake_engine_with_changed_signature_fails_naming_entry_point(tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path, replace={
        ("vllm/entrypoints/llm.py", "def generate(self, prompts, sampling_params=None"):
            "def generate(self, inputs, sampling_params=None"})
    bad = failing(VllmAdapter(py).probe())
    assert list(bad) == ["vllm.LLM.generate"]
    assert "`inputs`" in bad["vllm.LLM.generate"] and "`prompts`" in bad["vllm.LLM.generate"]


def test_engine_python_discovery(tmp_path, monkeypatch):
    monkeypatch.delenv("EYAS_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineError) as e:
        VllmAdapter()
    assert "EYAS_VLLM_PYTHON" in str(e.value) and HOW_TO_CREATE in str(e.value)
    py = fake_engine.make_fake_vllm(tmp_path)
    monkeypatch.setenv("EYAS_VLLM_PYTHON", str(py))
    assert VllmAdapter().python == py
    assert VllmAdapter(tmp_path).python == py  # an env directory means its bin/python
    with pytest.raises(EngineError, match="does not exist"):
        VllmAdapter(tmp_path / "nope" / "python")


def test_engine_without_vllm_says_how_to_create(tmp_path):
    assert VllmAdapter(sys.executable).version() is None  # metadata only: no vllm distribution there
    with pytest.raises(EngineError, match="import vllm"):
        VllmAdapter(sys.executable).probe()


def test_renamed_internal_of_subclassed_connector_is_caught(tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path, replace={
        ("vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py", "self._kv_cache ="):
            "self._hidden_cache ="})
    adapter = VllmAdapter(py)
    assert failing(adapter.probe(used_by="serve-check")) == {}  # serve-check does not use the connector
    bad = failing(adapter.probe(used_by="extraction"))
    name = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector.ExampleHiddenStatesConnector"
    assert list(bad) == [name] and "['_kv_cache']" in bad[name]


def test_engine_step_api_drift_is_caught_for_regenerate_only(tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path, replace={
        ("vllm/v1/engine/llm_engine.py", "def has_unfinished_requests(self)"): "def has_unfinished(self)",
        ("vllm/v1/engine/llm_engine.py", "def add_request(self, request_id, prompt, params"):
            "def add_request(self, request_id, inputs, params",
        ("vllm/sampling_params.py", "    FINAL_ONLY = 2\n"): ""})
    adapter = VllmAdapter(py)
    assert failing(adapter.probe(used_by="serve-check")) == {}
    bad = failing(adapter.probe(used_by="regenerate"))
    eng = "vllm.v1.engine.llm_engine.LLMEngine."
    assert set(bad) == {eng + "has_unfinished_requests", eng + "add_request", "vllm.sampling_params.RequestOutputKind"}
    assert bad[eng + "has_unfinished_requests"].startswith("absent") and "`inputs`" in bad[eng + "add_request"]
    assert "FINAL_ONLY" in bad["vllm.sampling_params.RequestOutputKind"]


@pytest.mark.slow
@pytest.mark.skipif(not REAL_VLLM.exists(), reason="no real vLLM env")
def test_real_vllm_env_matches_its_recorded_release():
    t0 = time.perf_counter()
    a = VllmAdapter(REAL_VLLM)
    version = a.version()
    assert failing(a.probe()) == {}
    live = a._probe_report()["signatures"]
    recorded = load_recorded(version)["signatures"]
    for name, sig in live.items():
        if "params" in sig:
            assert [p[0] for p in sig["params"]] == [p[0] for p in recorded[name]["params"]], name
        else:  # live attrs also include bases from other files
            assert set(recorded[name]["values"]) <= set(sig["values"]), name
    print(f"real vLLM {version} probe: {time.perf_counter() - t0:.1f}s, {a.timings()}")


def test_every_vllm_worker_spawns_its_engine_processes_unless_the_user_chose(monkeypatch):
    """vLLM forks its engine core on CUDA by default; a forked child hangs at its first threaded CPU op when the
    front end (a multimodal processor's dummy inputs) already started OpenMP threads. eyas asks for spawn."""
    from eyas.engines.vllm import worker_env
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert worker_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert VllmAdapter.env(None)["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"   # serve-check and the speedup bench
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    assert worker_env()["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_a_start_that_a_neighbour_spoiled_is_tried_once_more_and_nothing_else_is(monkeypatch):
    """vLLM's start-up check "Error in memory profiling" (another process freed GPU memory while it measured) is a
    neighbour's doing: the run starts once more; any other failure, or the same one twice, is raised."""
    from eyas.engines.vllm import VllmAdapter

    monkeypatch.setattr(VllmAdapter, "retry_wait_s", 0.0)
    failures = []

    def worker(python, script, payload, **kw):
        if failures:
            raise EngineError(failures.pop(0))
        return {"outputs": [[4, 5]], "version": "0.26.0", "startup_s": 1.0, "generate_s": 0.1, "counters": {}}

    monkeypatch.setattr("eyas.engines.base.run_in_env", worker)
    engine = VllmAdapter(sys.executable)
    spoiled = ("vllm_serve_worker.py failed (exit 1): AssertionError: Error in memory profiling. Initial free memory "
               "70.76 GiB, current free memory 76.65 GiB")
    failures[:] = [spoiled]
    with pytest.warns(RuntimeWarning, match="starting it once more"):
        assert engine.generate("t", [[1]], 2).outputs == [[4, 5]]
    failures[:] = [spoiled, spoiled]
    with pytest.warns(RuntimeWarning), pytest.raises(EngineError, match="Error in memory profiling"):
        engine.generate("t", [[1]], 2)
    failures[:] = ["CUDA out of memory"]
    with pytest.raises(EngineError, match="CUDA out of memory"):
        engine.generate("t", [[1]], 2)
    assert failures == []

"""SGLang behind the Engine interface, on CPU: its 0.5.14 entry points (recorded from the wheel's source), and a
stand-in `sglang` package that serves like the offline Engine (per-request spec-decode counters in meta_info), driven
through the adapter, serve-check (a tree on both sides) and the served-speedup sweep."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from eyas.draft.io import save_draft
from eyas.decode.tree import TreeSpec
from eyas.engines.base import EngineError
from eyas.engines.entry_points import check_signatures, load_recorded
from eyas.engines.serve_check import ServeCheckConfig, check
from eyas.engines.sglang import ENTRY_POINTS, SglangAdapter
from eyas.engines.speedup import measure
from eyas.export import export_sglang, export_vllm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from export_fixtures import make_draft, make_target_dir  # noqa: E402

ENGINE = '''
import json, os
_CFG = json.loads(os.environ.get("FAKE_SGLANG", "{}"))

def _log(**event):
    with open(_CFG["log"], "a") as f:
        f.write(json.dumps(event) + "\\n")

class Engine:
    """Greedy stand-in: each prompt continues with its last id + 1, 2, ...; with a draft, the first request of a
    call reports _CFG's verification steps and accepted drafts, every other request one step with none."""
    def __init__(self, **kwargs):
        self.kw = kwargs
        _log(init=kwargs)
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, top_logprobs_num=None):
        out = []
        for i, ids in enumerate(input_ids):
            toks = [(ids[-1] + 1 + j) % 90 for j in range(sampling_params["max_new_tokens"])]
            meta = {"completion_tokens": len(toks)}
            if self.kw.get("speculative_algorithm") == "EAGLE3":
                steps, acc = (_CFG.get("steps", 2), _CFG.get("accepted", 2)) if i == 0 else (1, 0)
                meta.update(spec_verify_ct=steps, spec_num_correct_drafts=acc,
                            spec_correct_drafts_histogram=_CFG.get("hist", [0, 2]) if i == 0 else [1])
            if return_logprob:
                meta["output_top_logprobs"] = [[(-2.0, t + 1, None), (-0.1, t, None)][:top_logprobs_num] for t in toks]
            out.append({"output_ids": toks, "meta_info": meta})
        return out
    def get_server_info(self):
        return {**self.kw, "version": "0.5.14"}
    def shutdown(self):
        _log(shutdown=True)
'''
FILES = {
    "sglang/__init__.py": '__version__ = "0.5.14"\n',
    "sglang/srt/__init__.py": "", "sglang/srt/entrypoints/__init__.py": "", "sglang/srt/entrypoints/engine.py": ENGINE,
    "sglang/srt/server_args.py": "import dataclasses\n@dataclasses.dataclass\nclass ServerArgs:\n    model_path: str\n"
                                 + "".join(f"    {k}: object = None\n" for k in ENTRY_POINTS[0].keywords[1:]),
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/spec_info.py": "import enum\nclass SpeculativeAlgorithm(enum.Enum):\n    EAGLE = 1\n"
                                           "    EAGLE3 = 2\n",
    "sglang/srt/speculative/eagle_worker_v2.py": "class EAGLEWorkerV2:\n    def forward_batch_generation(self, b):\n"
                                                 "        pass\n    def verify(self, b):\n        pass\n",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/model_runner.py": "class ModelRunner:\n    def forward(self, b):\n        pass\n",
    "sglang/srt/layers/__init__.py": "", "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/triton_backend.py": "class TritonAttnBackend:\n"
                                                     "    def init_forward_metadata(self, b):\n        pass\n",
    "sglang/srt/models/__init__.py": "",
    "sglang/srt/models/llama_eagle3.py": "class LlamaForCausalLMEagle3:\n    def __init__(self):\n"
                                         "        self.hot_token_id = None\n    def load_weights(self, w):\n"
                                         "        pass\n",
}


def fake_sglang(root: Path, monkeypatch, **cfg) -> Path:
    """A `python` whose `import sglang` is the stand-in above, like a venv with sglang installed; its engines log
    their keyword arguments and shutdowns to root/engine.jsonl."""
    for rel, text in FILES.items():
        (root / "fake" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "fake" / rel).write_text(text)
    monkeypatch.setenv("FAKE_SGLANG", json.dumps({"log": str(root / "engine.jsonl"), **cfg}))
    py = root / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={root / 'fake'} exec {sys.executable} \"$@\"\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return py


def events(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "engine.jsonl").read_text().splitlines()]


def failing(results):
    return {r.entry_point: r.detail for r in results if not r.ok}


def test_sglang_0_5_14_binds_every_call_eyas_makes():
    """Recorded from the sglang 0.5.14 wheel's source (python -m eyas.engines.signatures.record --engine sglang)."""
    doc = load_recorded("sglang", "0.5.14")
    assert set(doc["signatures"]) == {ep.name for ep in ENTRY_POINTS}, "re-record after changing ENTRY_POINTS"
    assert failing(check_signatures(doc["signatures"], ENTRY_POINTS)) == {}
    sigs = json.loads(json.dumps(doc["signatures"]))
    server_args = "sglang.srt.server_args.ServerArgs"
    sigs[server_args]["params"] = [p for p in sigs[server_args]["params"] if p[0] != "speculative_eagle_topk"]
    bad = failing(check_signatures(sigs, ENTRY_POINTS))
    assert "speculative_eagle_topk" in bad[server_args] and "speculative_eagle_topk" in bad[ENTRY_POINTS[0].name]


def test_probe_and_version_on_a_stand_in_env(tmp_path, monkeypatch):
    engine = SglangAdapter(fake_sglang(tmp_path, monkeypatch))
    assert engine.version() == "0.5.14" and engine.version_status("0.5.14")[0] == "pass"
    assert failing(engine.probe()) == {}


def test_without_an_env_the_error_says_how_to_make_one(monkeypatch):
    monkeypatch.delenv("EYAS_SGLANG_PYTHON", raising=False)
    with pytest.raises(EngineError, match="(?s)EYAS_SGLANG_PYTHON.*pip install sglang==0.5.14"):
        SglangAdapter()


def test_tree_reaches_the_engine_and_tau_comes_from_its_counters(tmp_path, monkeypatch):
    # request 0: 4 steps accepting 6 drafts (histogram by accepted drafts: 0 steps with none, 2 with one, 2 with two)
    py = fake_sglang(tmp_path, monkeypatch, steps=4, accepted=6, hist=[0, 2, 2])
    engine = SglangAdapter(py)
    tree = TreeSpec(total=5, depth=3, topk=2)
    served = engine.serve("/models/t", "/exports/x", [[1, 2], [5]], 3, tree, dtype="bf16", logprobs=2)
    init = events(tmp_path)[0]["init"]
    assert (init["speculative_algorithm"], init["speculative_num_steps"], init["speculative_eagle_topk"],
            init["speculative_num_draft_tokens"]) == ("EAGLE3", 3, 2, 6)  # 5 nodes + the root
    assert init["model_path"] == "/models/t" and init["speculative_draft_model_path"] == "/exports/x"
    assert init["dtype"] == "bfloat16" and init["attention_backend"] == "triton"
    assert events(tmp_path)[-1] == {"shutdown": True}
    # totals: request 0 (4 steps, 6 accepted, hist [0,2,2]) + request 1 (1 step, 0 accepted, hist [1])
    assert served.stats.steps == 5 and served.stats.tau == pytest.approx(1 + 6 / 5)
    assert served.stats.accept_per_position == pytest.approx([4 / 5, 2 / 5])  # steps accepting > 0, > 1 drafts
    assert served.outputs == [[3, 4, 5], [6, 7, 8]] and served.config["speculative_eagle_topk"] == 2
    assert served.logprobs[0][0] == [[3, -0.1], [4, -2.0]]  # best first
    plain = engine.generate("/models/t", [[1]], 2)
    assert plain.stats is None and "speculative_algorithm" not in events(tmp_path)[-2]["init"]


def test_attention_backend_is_triton_unless_asked(tmp_path, monkeypatch):
    engine = SglangAdapter(fake_sglang(tmp_path, monkeypatch))
    kwargs = engine.engine_request("t", "x", None, dtype="fp32", max_model_len=64)["kwargs"]
    assert kwargs["attention_backend"] == "triton" and kwargs["speculative_num_steps"] == 3  # default: a chain of 3
    fa3 = engine.engine_request("t", "x", None, dtype="bf16", max_model_len=64, attention_backend="fa3")["kwargs"]
    assert fa3["attention_backend"] == "fa3"


def test_tensor_and_expert_parallel_map_to_tp_size_and_ep_size(tmp_path, monkeypatch):
    engine = SglangAdapter(fake_sglang(tmp_path, monkeypatch))
    plain = engine.engine_request("t", "x", None, dtype="bf16", max_model_len=64)["kwargs"]
    assert "tp_size" not in plain and "ep_size" not in plain
    tp = engine.engine_request("t", "x", None, dtype="bf16", max_model_len=64, tensor_parallel_size=2)["kwargs"]
    assert tp["tp_size"] == 2 and "ep_size" not in tp
    ep = engine.engine_request("t", "x", None, dtype="bf16", max_model_len=64, tensor_parallel_size=2,
                               expert_parallel=True)["kwargs"]
    assert ep["tp_size"] == 2 and ep["ep_size"] == 2   # SGLang's experts split over the tensor-parallel group


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("sg")
    tdir, tmodel = make_target_dir(root / "target")
    from tests.target.fixtures import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tdir)  # the native side templates the prompts
    # SGLang's midlayer keeps the residual before hidden_norm: the draft must be trained that way to be served there
    ddir = save_draft(make_draft(tmodel, norm_before_residual=False), root / "draft", {"target": str(tdir)})
    return tdir, export_sglang(ddir, root / "export-sglang"), export_vllm(ddir, root / "export-vllm")


def test_serve_check_refuses_fp32_on_sglang_before_the_engine_starts(exports, tmp_path, monkeypatch):
    """sgl_kernel's RMSNorm has no fp32 kernel (the H200 run died in its first forward): said in one line, up front."""
    tdir, export, _ = exports
    py = fake_sglang(tmp_path, monkeypatch, steps=1, accepted=0, hist=[1])
    with pytest.raises(EngineError, match="SGLang serves bf16 only; pass --dtype bf16"):
        check(ServeCheckConfig(draft=export, engine="sglang", tree="total=4,depth=2,topk=2", per_category=1,
                               categories=["writing"], max_new_tokens=6, dtype="fp32", python=str(py)))
    assert not (tmp_path / "engine.jsonl").exists()   # no engine started


def test_serve_check_compares_a_served_tree_with_the_native_tree(exports, tmp_path, monkeypatch):
    tdir, export, _ = exports
    cfg = dict(draft=export, engine="sglang", tree="total=4,depth=2,topk=2", per_category=1, categories=["writing"],
               max_new_tokens=6, tolerance=0.05)
    py = fake_sglang(tmp_path, monkeypatch, steps=1, accepted=0, hist=[1])
    first = check(ServeCheckConfig(**cfg, python=str(py)))
    init = events(tmp_path)[0]["init"]
    assert init["model_path"] == str(tdir.resolve()) and init["speculative_draft_model_path"] == str(export.resolve())
    assert (init["speculative_num_steps"], init["speculative_eagle_topk"], init["speculative_num_draft_tokens"]) == \
        (2, 2, 5) and init["attention_backend"] == "triton" and init["dtype"] == "bfloat16"   # SGLang's default: no fp32 kernels
    assert first["engine"] == "sglang" and first["tree"] == cfg["tree"] and first["sglang"]["version"] == "0.5.14"
    assert first["ok"] is (abs(1.0 - first["native_tau"]) <= 0.05 * first["native_tau"])
    # the engine reports exactly the native run's steps and accepted drafts: τ agrees, the check passes
    steps = first["native_steps"]
    accepted = round((first["native_tau"] - 1) * steps)
    py = fake_sglang(tmp_path / "again", monkeypatch, steps=steps, accepted=accepted, hist=[steps])
    again = check(ServeCheckConfig(**cfg, python=str(py)))
    assert again["ok"], again.get("reason")
    assert again["served_tau"] == pytest.approx(again["native_tau"]) and again["served_drafts"] == steps


def test_serve_check_names_the_format_and_the_engine_that_drafts_trees(exports, tmp_path, monkeypatch):
    _, sglang_export, vllm_export = exports
    from eyas.export import ContractError

    with pytest.raises(ContractError, match="--engine sglang serves `eyas export --format sglang`"):
        check(ServeCheckConfig(draft=vllm_export, engine="sglang", python=sys.executable))
    with pytest.raises(ValueError, match="vLLM drafts chains only"):
        check(ServeCheckConfig(draft=vllm_export, engine="vllm", tree="total=4,depth=2,topk=2",
                               python=sys.executable))


def test_speedup_sweep_times_chains_and_trees_from_one_export(tmp_path, monkeypatch):
    py = fake_sglang(tmp_path, monkeypatch, steps=2, accepted=2, hist=[0, 2])
    tree = TreeSpec(total=4, depth=2, topk=2)
    res = measure(SglangAdapter(py), "/models/t", "/exports/x", [[1, 2, 3], [4, 5]], [3, tree], [1, 2], 3, ["0"],
                  tmp_path / "logs", engines_per_gpu=3)
    assert not res["failed"] and res["engine"] == "sglang" and res["engine_version"] == "0.5.14"
    assert sorted(res["engines"]) == ["base", "k3", "t4-2-2"]
    inits = [e["init"] for e in events(tmp_path) if "init" in e]
    assert all(i["mem_fraction_static"] == pytest.approx(0.85 / 3) and i["disable_cuda_graph"] is False for i in inits)
    drafts = {i.get("speculative_eagle_topk"): i.get("speculative_draft_model_path") for i in inits}
    assert drafts == {None: None, 1: "/exports/x", 2: "/exports/x"}          # one export serves every setting
    tree_rows = [r for r in res["rows"] if r.get("tree") == "total=4,depth=2,topk=2"]
    assert [r["batch_size"] for r in tree_rows] == [1, 2] and all(r["speedup"] > 0 for r in tree_rows)
    assert {r["spec"] for r in res["rows"]} == {"chain-3", tree.label()}

"""`eyas eval`: run Spec-Bench (or any JSONL) through the AR baseline and speculative decoding.

The command: its flags, loading the target and draft pair (checked against each other first), the warnings
about what the numbers describe, and the result JSON with where it ran. The decoding itself is the Session's
(session.py); the printed summary is report.py's; `--tree auto` and the cost model's check are calibration.py's.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from pydantic import Field

from eyas import env
from eyas.config import StageConfig
from eyas.decode import vllm_reference
from eyas.decode.bench import SPEC_BENCH, load_bench
from eyas.decode.calibration import AUTO_PROBE, calibrate, predicted_vs_measured
from eyas.decode.costmodel import Costs
from eyas.decode.report import table
from eyas.decode.session import Session, turn_prompt
from eyas.decode.tree import TreeSpec
from eyas.devices import resolve_device, resolve_dtype
from eyas.flags import CacheDir, Device, JsonSwitch, ModelDtype, ResultsFile, Target, TrustRemoteCode
from eyas.draft.io import load_draft, read_draft_config, read_draft_meta, target_problems
from eyas.outputs import claim, input_id, same_input, write_result
from eyas.target import load_config, load_target, text_config


class EvalConfig(StageConfig):
    target: Target
    draft: Path = Field(description="draft dir (eyas train run or eyas import output)")
    bench: str = Field(SPEC_BENCH, description="'spec-bench' or a JSONL file with question_id, category, turns")
    categories: list[str] | None = Field(None, description="only these categories")
    per_category: int | None = Field(None, ge=1, description="at most this many questions per category")
    max_new_tokens: int = Field(512, ge=1, description="new tokens per turn")
    temperature: float = Field(0.0, ge=0, description="0 = greedy (checked token-identical); >0 = rejection sampling")
    chain: int | None = Field(None, ge=1, description="chain of K drafted tokens (default 3 when --tree is not given)")
    tree: str | None = Field(None, description="'total=60,depth=7,topk=10' or 'auto' (cost model picks)")
    device: Device = "auto"
    dtype: ModelDtype = "auto"
    compile: bool | None = Field(None, description="torch.compile reduce-overhead (CUDA graphs); default on for cuda")
    json: JsonSwitch = False
    out: ResultsFile = None
    plots: Path | None = Field(None, description="write PNG plots into this directory")
    seed: int = Field(0, description="sampling seed (temperature > 0)")
    baseline_cache: Path | None = Field(None, description="a directory: reuse the AR baseline of an earlier eval with "
                                        "the same target, questions and settings (every draft of a scaling curve "
                                        "against one baseline; any difference misses and regenerates it)")
    min_bucket: int | None = Field(None, ge=1, description="smallest KV bucket the compiled decoder attends over "
                                   "(default $EYAS_DECODE_MIN_BUCKET or 1024); each bucket is one more compile per "
                                   "step width, so a value at or above the capacity (e.g. 1000000) compiles each "
                                   "width once")
    timings_shared: bool = Field(False, description="other work runs on the device meanwhile (a recipe's eval beside "
                                "training): τ, acceptance and tokens are exact, timings are not, so no speedup is "
                                "reported and the AR baseline it stores in --baseline-cache is marked as shared "
                                "(an eval that times alone never uses its timings)")
    recheck: int = Field(4, ge=0, description="greedy: decode up to N turns whose divergence is not a logit tie again, "
                         "alone, in fp32 and in --dtype; verdict 'numerics' (fp32 is exact) or 'decoder' (0: off)")
    calib: int = Field(1, ge=1, description="--tree auto: questions per category for the calibration run")
    warm_only: bool = Field(False, description="only compile and capture every setting's static shapes, decode and "
                            "time nothing: run beside training on a draft of the same config, so that the eval "
                            "after it finds inductor's on-disk caches warm")
    overwrite: bool = Field(False, description="--out holds a file eyas did not write (or another command's): "
                                               "replace it")
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False


def hardware(device: torch.device) -> dict:
    info = {"device": str(device), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None

def evaluate(target, draft, questions, *, chain=None, tree=None, max_new_tokens=512, temperature=0.0, device=None,
             compile_graphs=None, seed=0, session: Session | None = None) -> dict:
    """One setting (chain K, or tree: TreeSpec / 'total=..,depth=..,topk=..') over `questions`.
    `target`: eyas Target or spec string; `draft`: a draft model (any kind) or a draft dir. Returns the result dict
    (tau, accept_per_position, tokens_per_s, baseline_tokens_per_s, speedup, identical_rate, per_category, ...)."""
    if (chain is None) == (tree is None):
        raise ValueError("evaluate: give exactly one of chain=K or tree=...")
    spec = TreeSpec.chain(int(chain)) if chain is not None else (tree if isinstance(tree, TreeSpec)
                                                                  else TreeSpec.parse(str(tree)))
    if session is not None:
        return session.run(spec)[0]
    target, draft = load_pair(target, draft, device, None)
    with Session(target, draft, questions, max_new_tokens=max_new_tokens, temperature=temperature,
                 device=device, compile_graphs=compile_graphs, seed=seed) as own:   # its hooks off the target after
        return own.run(spec)[0]


def load_pair(target, draft, device, dtype_name, cache=None, trust_remote_code=False):
    """(Target, draft model) from specs or loaded objects; a draft dir is checked before any weight loads."""
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype_name or "auto", dev)
    if isinstance(draft, (str, os.PathLike)):   # the draft's config is checked before any weight loads
        dc = read_draft_config(draft)
        if isinstance(target, (str, os.PathLike)):
            t = text_config(load_config(target, cache=cache, trust_remote_code=trust_remote_code))
            sizes = (int(t.vocab_size), int(t.hidden_size), int(t.num_hidden_layers))
        else:
            sizes = (target.layout.vocab_size, target.layout.hidden_size, target.layout.num_layers)
        bad = target_problems(vocab_size=dc.vocab_size, target_hidden_size=dc.target_hidden_size,
                              aux_layer_ids=dc.aux_layer_ids, target_vocab=sizes[0], target_hidden=sizes[1],
                              num_layers=sizes[2])
        if bad:
            raise ValueError(f"--draft {draft} does not fit --target {getattr(target, 'source', target)}: "
                             f"{'; '.join(bad)}; evaluate it with the target it was trained for")
    if isinstance(target, (str, os.PathLike)):
        target = load_target(target, dtype=dtype, device=dev, cache=cache, trust_remote_code=trust_remote_code,
                             attn_implementation="sdpa")
    if isinstance(draft, (str, os.PathLike)):
        draft, _ = load_draft(draft, device=dev, dtype=target.layout.lm_head.weight.dtype)
    return target, draft


def run(cfg: EvalConfig, reuse: dict | None = None) -> dict | int:
    """`eyas eval`. reuse: a dict kept across calls (same target, draft and questions, another temperature):
    the loaded models and the compiled target step and proposers are taken from it instead of rebuilt."""
    if not (Path(cfg.draft) / "config.json").is_file():  # before the target loads (minutes on a busy CPU)
        raise FileNotFoundError(f"--draft {cfg.draft}: " + ("no such directory" if not Path(cfg.draft).exists() else
                                "no config.json in it") + " (give an `eyas train --out` dir or an `eyas import` dir)")
    if cfg.out is None:
        return _run(cfg, reuse)
    with claim(cfg.out, "eval", overwrite=cfg.overwrite,    # before anything loads: a wrong --out fails at once
               inputs={"draft": cfg.draft, "bench": cfg.bench, "target": cfg.target}):
        return _run(cfg, reuse)


def _run(cfg: EvalConfig, reuse: dict | None) -> dict | int:
    pair_key = (cfg.target, str(cfg.draft), cfg.device, cfg.dtype)
    if reuse is not None and reuse.get("pair_key") == pair_key:
        target, draft = reuse["pair"]
    else:
        target, draft = load_pair(cfg.target, cfg.draft, cfg.device, cfg.dtype, cfg.cache_dir, cfg.trust_remote_code)
        if reuse is not None:
            reuse.clear()
            reuse.update(pair_key=pair_key, pair=(target, draft), session={})
    questions = load_bench(cfg.bench, cfg.categories, cfg.per_category)
    warnings = pairing_warnings(cfg, target, questions)
    s = Session(target, draft, questions, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                compile_graphs=cfg.compile, seed=cfg.seed, reuse=None if reuse is None else reuse["session"],
                baseline_cache=cfg.baseline_cache, min_bucket=cfg.min_bucket, shared=cfg.timings_shared)
    specs = []
    if cfg.chain is not None or cfg.tree is None:
        specs.append(TreeSpec.chain(cfg.chain or 3))
    costs, auto = Costs(ar_step=0.0), None
    by_spec: list[tuple[TreeSpec, list[dict]]] = []   # the rounds each setting recorded, for the cost model
    if cfg.tree == "auto":
        if cfg.warm_only:
            raise ValueError("--warm-only warms given settings; --tree auto would decode to choose one: name the tree")
        if cfg.temperature > 0:
            raise ValueError("--tree auto calibrates on greedy acceptance; use --temperature 0")
        probe: list[dict] = []
        calib = load_bench(cfg.bench, cfg.categories, cfg.calib)   # in a session of its own, dropped once it chose
        with Session(target, draft, calib, max_new_tokens=min(cfg.max_new_tokens, 128), temperature=0.0,
                     compile_graphs=cfg.compile, seed=cfg.seed, min_bucket=cfg.min_bucket) as cs:
            auto = calibrate(cs, costs, probe)
        by_spec.append((AUTO_PROBE, probe))
        specs.append(auto["chosen"])
    elif cfg.tree:
        specs.append(TreeSpec.parse(cfg.tree))
    if cfg.warm_only:
        return _warm_only(cfg, s, specs)
    results = []
    for spec in specs:
        res, st = s.run(spec, record=cfg.temperature <= 0, recheck_n=cfg.recheck)
        costs.ar_step, costs.ar_prefill = s.ar_step(), s.ar_prefill()
        costs.add_run(spec, st)
        by_spec.append((spec, st.rounds))
        results.append(res)
    hw = hardware(s.device)
    ref = vllm_reference.lookup(target.model.config, hw.get("gpu"), str(s.runner.dtype), batch=1)
    for r in results:   # eyas's speed over vLLM's AR for the same architecture, GPU and dtype, where measured
        r["speedup_vs_vllm_ar"] = vllm_reference.versus(r["tokens_per_s"], ref)
    if cfg.timings_shared:
        untimed(results, warnings)
    if getattr(s.runner, "prefill_graph_error", None):   # timings after it include eager prefills
        warnings.append(f"prefills ran eagerly after a CUDA graph capture failed ({s.runner.prefill_graph_error}); "
                        "see each setting's decode.prefill_graphs")
    out = {"target": cfg.target, "draft": str(cfg.draft), "bench": cfg.bench, "questions": len(questions),
           "hardware": hw, "commit": commit(), "switches": env.changed(), "results": results, "vllm_reference": ref, "warnings": warnings,
           "baseline": {"turns": len(s.baseline), "from_cache": s.cached_turns,
                        "cache": str(cfg.baseline_cache) if cfg.baseline_cache else None,
                        "cache_check": s.cache_check}}
    if cfg.temperature <= 0 and not cfg.timings_shared and any(rounds for _, rounds in by_spec):
        out["cost_model"] = {"costs": costs.to_dict(),
                             "predicted_vs_measured": predicted_vs_measured(by_spec, results, costs)}
        if auto:
            out["cost_model"]["auto"] = {"chosen": auto["chosen"].label(), "predictions": auto["predictions"][:10]}
    out.update({k: v for k, v in results[-1].items() if k != "setting"})  # headline = last setting
    if cfg.plots:
        from eyas.decode.plots import write_plots
        out["plots"] = write_plots(results, cfg.plots)
    if cfg.out:
        write_result(cfg.out, json.dumps(out, indent=2, default=str))
    if cfg.json:
        return out
    print(table(out))
    return 0


def untimed(results: list[dict], warnings: list[str]) -> None:
    """--timings-shared: the wall-clock rates describe the neighbour as much as the decoder, so no ratio of them is
    reported (tok/s stay, as measured, for the record)."""
    for r in results:
        for x in (r, *r["per_category"].values()):
            x["speedup"] = None
        r["speedup_vs_vllm_ar"] = None
        r["timed_alone"] = False
    warnings.append("timed while other work shared the device (--timings-shared): τ and tokens are exact, no speedup "
                    "is reported")


def pairing_warnings(cfg: EvalConfig, target, questions: list[dict]) -> list[str]:
    """What makes the numbers describe something else than asked, each printed as it is found: a draft trained for
    other target weights, a prompt past the target's context. A prompt that cannot fit at all is refused."""
    out = []
    trained = (read_draft_meta(cfg.draft).get("target") or {})
    have = trained.get("sha256") if isinstance(trained, dict) else None
    now = input_id(cfg.target, cache=cfg.cache_dir)
    if have and now.get("sha256") and not same_input({"sha256": have}, now):
        out.append(f"the draft was trained for target {trained.get('name')} (content {have[:12]}), not for "
                   f"--target {cfg.target} (content {now['sha256'][:12]}): its τ and speedup describe a pairing it "
                   f"was not made for")
    mpe = getattr(text_config(target.config), "max_position_embeddings", None)
    if mpe:
        for q in questions:
            n = len(turn_prompt(target.tokenizer, q, []))
            if n > mpe:
                raise ValueError(f"--bench {cfg.bench}: question {q['question_id']!r} is {n} tokens, more than the "
                                 f"target's max_position_embeddings ({mpe}); leave it out (--categories, or a "
                                 f"shorter bench file)")
            if n + cfg.max_new_tokens > mpe:
                out.append(f"question {q['question_id']!r}: {n} prompt tokens + --max-new-tokens "
                           f"{cfg.max_new_tokens} may pass the target's max_position_embeddings ({mpe})")
                break
    for w in out:
        print(f"eyas eval: warning: {w}", file=sys.stderr)
    return out


def _warm_only(cfg: EvalConfig, s: Session, specs: list[TreeSpec]) -> dict | int:
    """--warm-only: each setting's warm-up as `Session.run` does it (compiles, graph captures), nothing timed."""
    t0, seconds = time.perf_counter(), {}
    for spec in specs:
        t = time.perf_counter()
        s.warmup(spec)
        seconds[spec.label()] = round(time.perf_counter() - t, 2)
    out = {"warm_only": True, "target": cfg.target, "draft": str(cfg.draft), "compiled": s.compile,
           "kv_buckets": list(s.runner.buckets), "seconds": seconds, "total_s": round(time.perf_counter() - t0, 2)}
    if cfg.out:
        write_result(cfg.out, json.dumps(out, indent=2))
    if cfg.json:
        return out
    print(f"warmed {', '.join(seconds)} in {out['total_s']} s (compiled: {s.compile})")
    return 0

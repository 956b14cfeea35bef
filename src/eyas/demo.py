"""`eyas demo`: the whole flow on the built-in model and dataset, timed stage by stage.

fetch -> regenerate (target's own answers) -> prepare -> extract -> train -> eval -> export -> doctor,
then a summary table and a one-page Markdown report with the plots. Each stage is the same library call
its own command makes, so the demo exercises exactly what users run. Defaults fit ~10 minutes on a
2-core CPU; `--device cuda --max-samples 5000` scales the same flow up.

The demo is a recipe (eyas.recipes): its two profiles are the recipe files demo-cpu and demo-gpu, its stages the
steps of this module's plan. `eyas demo` runs one from the start; `eyas run demo-gpu --out DIR` resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from eyas.config import StageConfig, build_config
from eyas.data.prepare import PrepareConfig, run as prepare
from eyas.data.regenerate import RegenerateConfig, regenerate
from eyas.data.sources import BUILTIN_DATASETS, iter_conversations, resolve_data
from eyas.decode.bench import load_bench
from eyas.decode.divergence import COUNTS
from eyas.decode.evaluate import EvalConfig, run as evaluate
from eyas.decode.prewarm import Prewarm, cli_flags, train_warm as start_train_warm
from eyas.decode.vllm_reference import expectation_line, expected_in_vllm
from eyas.devices import fast_bf16, resolve_device
from eyas.flags import CacheDir, Device, DraftVocabSize, JsonSwitch, Target
from eyas.doctor import DoctorConfig, diagnose, render_table
from eyas.export.commands import ExportConfig, run_export
from eyas.extract import ExtractConfig, run as extract
from eyas.recipes import Runner, load_recipe, run_recipe
from eyas.recipes.recipe import Recipe, file_params
from eyas.outputs import claim
from eyas.target import BUILTIN_TARGETS, resolve
from eyas.train.loop import TrainConfig, run as train


class DemoConfig(StageConfig):
    target: Target = "smollm2-135m"
    data: str = Field("sharegpt", description="conversations (ShareGPT/messages JSONL or built-in 'sharegpt')")
    out: Path = Field(Path("eyas-demo"), description="output directory for every stage")
    max_samples: int = Field(160, ge=8, description="conversations to use")
    regenerate: bool = Field(True, description="replace assistant turns with the target's own answers first")
    regen_max_new_tokens: int = Field(160, ge=8, description="max tokens per regenerated answer")
    regen_batch_size: int = Field(80, ge=1, description="conversations per generation batch")
    regen_max_prompt_tokens: int | None = Field(None, ge=1, description="regenerate: a longer prompt is not answered "
                                                "(default max_length // 2; gpu profile: 1536, so the long prompts of "
                                                "summarization and RAG are answered too)")
    max_length: int = Field(1024, ge=64, description="tokens per packed training row")
    draft_vocab_size: DraftVocabSize = 4096                      # the cpu profile's: a short run's data
    ttt_steps: int = Field(3, ge=1, description="training-time-test steps")
    epochs: float = Field(4.0, gt=0, description="training epochs over the extracted store")
    lr: float = Field(2e-3, gt=0, description="peak learning rate")
    chain: int = Field(3, ge=1, description="chain length for evaluation and export")
    tree: str | None = Field(None, description="also evaluate this draft tree, e.g. 'total=60,depth=7,topk=10' (gpu profile: that tree)")
    bench: str = Field("spec-bench", description="evaluation prompts: 'spec-bench' or a JSONL (question_id, category, turns)")
    eval_per_category: int = Field(1, ge=1, description="Spec-Bench questions per category")
    eval_max_new_tokens: int = Field(64, ge=8, description="new tokens per evaluated turn")
    device: Device = "auto"
    cache_dir: CacheDir = None
    seed: int = Field(0, description="seed for data order and initialisation")
    json: JsonSwitch = False
    profile: Literal["auto", "cpu", "gpu"] = Field("auto", description="size preset: gpu (on cuda: more data through the native generator, a larger draft, more steps; ~10 min on one H200) or cpu (the defaults); flags given explicitly win")
    train_batch_size: int = Field(2, ge=1, description="training batch size")
    regen_backend: Literal["hf", "native"] = Field("hf", description="regenerate backend (gpu profile: native)")
    regen_attention: Literal["sdpa", "flex"] = Field("sdpa", description="native regenerate: the decode step's "
                                                     "attention (gpu profile: flex, 1.5x the sdpa rate at batch 512)")
    self_prompts: int = Field(0, ge=0, description="also N prompts the target writes itself (self:N), answered the "
                              "same way: the math, code and translation a chat set lacks (gpu profile: 13000)")
    eval_min_bucket: int | None = Field(None, ge=1, description="eval: smallest KV bucket of the compiled decoder "
                                        "(gpu profile: 1000000, one bucket: each step width compiles once)")
    eval_warm_background: bool = Field(False, description="compile the eval's graphs beside training, on its first "
                                       "held-out-best draft (a background `eyas eval --warm-only`), so the eval "
                                       "starts from inductor's warm caches (gpu profile: on)")
    train_warm_background: bool = Field(False, description="compile the training step's graphs beside the data "
                                        "stages (a background `eyas train --warm-only` on stand-in rows of the same "
                                        "shapes), so training starts from inductor's warm caches (online only; gpu "
                                        "profile: on)")
    online: bool = Field(False, description="train online: the target's states computed inside each training step, "
                         "no extract stage and no store (gpu profile: on; its ~5M tokens would make a ~25 GB store)")
    overwrite: bool = Field(False, description="--out holds something else eyas wrote, or regenerated conversations "
                            "made with other settings: replace them")


# The gpu profile (recipes/files/demo-gpu.yaml, which says why each size): fields the user did not set take it.
GPU_PROFILE: dict[str, Any] = {k: v for k, v in file_params("demo-gpu").items() if k not in ("profile", "device")}
CONFIG = DemoConfig   # the demo recipes' parameters (eyas.recipes)
IDENTITY = None


def with_profile(cfg: DemoConfig, device: str) -> DemoConfig:
    profile = cfg.profile if cfg.profile != "auto" else ("gpu" if device.startswith("cuda") else "cpu")
    if profile == "cpu":
        return cfg
    return cfg.model_copy(update={k: v for k, v in GPU_PROFILE.items() if k not in cfg.model_fields_set})


def _call(fn, cls: type[StageConfig], **kw: Any):
    """One stage, exactly as its command runs it: the flags validated by its config class, then its run."""
    return fn(build_config(cls, {k: v for k, v in kw.items() if v is not None}))


def run(cfg: DemoConfig) -> int | dict:
    """`eyas demo`: the demo recipe of the device's profile (demo-cpu / demo-gpu) with the flags given, from the
    start (a rerun redoes every stage; `eyas run demo-cpu --out DIR` resumes instead)."""
    device = str(resolve_device(cfg.device))
    profile = cfg.profile if cfg.profile != "auto" else ("gpu" if device.startswith("cuda") else "cpu")
    given = {k: getattr(cfg, k) for k in cfg.model_fields_set if k not in ("out", "json", "profile", "overwrite")}
    # The demo owns --out (eyas.outputs): a directory of other files, or an input, is refused before any stage runs;
    # its stages then own their own outputs inside it.
    with claim(cfg.out, "demo", overwrite=cfg.overwrite,
               inputs={"target": cfg.target, "data": cfg.data, "bench": cfg.bench}) as held:
        _, result = run_recipe(load_recipe(f"demo-{profile}", given), held.path, fresh=True)
    summary = {k: v for k, v in result.items() if k not in ("left", "files")}
    if cfg.json:
        return summary
    _print_table(summary)
    return 0 if summary["doctor"]["ok"] else 1


def run_plan(r: Runner, recipe: Recipe) -> dict:
    """The demo's stages as steps of one recipe run, each result kept in OUT/state.json."""
    cfg = build_config(DemoConfig, {**recipe.params, "out": r.work})
    device = str(resolve_device(cfg.device))
    cfg = with_profile(cfg, device)
    out = cfg.out.resolve()
    paths = {k: out / k for k in ("regenerated", "prepared", *(() if cfg.online else ("store",)), "run", "eval",
                                  "export")}
    times: dict[str, float] = {}
    cache = str(cfg.cache_dir) if cfg.cache_dir else None
    preflight(cfg, out)

    def step(name: str, fn):
        done, result = r.call(name, lambda: _timed(name, fn))
        times[name] = r.seconds(name)
        return result

    def fetch():
        src, data = resolve(cfg.target, cache=cache), resolve_data(cfg.data, cache=cache)
        print(f"target: {src.path}\ndata:   {data}")
        return str(data)

    data = Path(step("fetch", fetch))
    # Every training flag but its data and length, shared by the warm-up and the run: the warm-up's graphs are the
    # run's only if their shapes and dtypes agree.
    train_kw = dict(target=cfg.target, online=cfg.online, ttt_steps=cfg.ttt_steps, tau_chain=cfg.chain, lr=cfg.lr,
                    device=device, seed=cfg.seed, eval_every=50, save_every=10_000, log_every=10,
                    target_dtype="bf16" if fast_bf16(device) else "auto", batch_size=cfg.train_batch_size,
                    init_head=False)
    train_warm = None
    if cfg.train_warm_background and cfg.online and not r.done("prepare"):   # the step's compiles beside the data
        train_warm = start_train_warm(out / "train-warm", cfg.max_length, cfg.draft_vocab_size, cli_flags(train_kw))
    try:
        regen = step("regenerate", lambda: _regenerate(cfg, device, data, paths, cache)) if cfg.regenerate else None
        prep = step("prepare", lambda: _call(
            prepare, PrepareConfig, target=cfg.target, data=(regen or {}).get("data") or str(data),
            out=paths["prepared"], max_samples=cfg.max_samples + cfg.self_prompts, max_length=cfg.max_length,
            draft_vocab_size=cfg.draft_vocab_size, overwrite=True, cache_dir=cache, json=True))
    except BaseException:
        if train_warm is not None:   # nothing left running after a failed data stage
            train_warm.finish(timeout=0)
        raise
    if train_warm is not None:   # never two compiles of the same graphs at once: wait for it (bounded)
        r.state["train_warm"] = train_warm.finish_waited(timeout=240)
        r.save()

    ext = None
    if not cfg.online:
        ext = step("extract", lambda: _call(extract, ExtractConfig, target=cfg.target, data=paths["prepared"],
                                            out=paths["store"], store_dtype="bf16", device=device, overwrite=True,
                                            cache_dir=cache))

    eval_kw = dict(target=cfg.target, bench=cfg.bench, per_category=cfg.eval_per_category,
                   max_new_tokens=cfg.eval_max_new_tokens, chain=cfg.chain, tree=cfg.tree, min_bucket=cfg.eval_min_bucket,
                   device=device, cache_dir=cache)
    prewarm = Prewarm(paths["run"], out / "eval-warm", eval_kw) \
        if cfg.eval_warm_background and not r.done("train") else None
    try:
        tr = step("train", lambda: _call(train, TrainConfig, store=paths.get("store"), data=paths["prepared"],
                                         out=paths["run"], epochs=cfg.epochs, overwrite=True, **train_kw))
    except BaseException:
        if prewarm is not None:   # no warm-up left running after a failed (or interrupted) training
            prewarm.finish(timeout=0)
        raise

    def evaluate_draft():
        # the background warm-up must not share the GPU with the timed eval: waited for (bounded), then stopped
        warm = prewarm.finish(timeout=300) if prewarm is not None else None
        ev = _call(evaluate, EvalConfig, draft=paths["run"], **eval_kw, out=paths["eval"] / "eval.json", json=True,
                   plots=paths["eval"])
        if warm is not None:
            ev["warm_background"] = warm
        return ev

    ev = step("eval", evaluate_draft)
    exp = step("export", lambda: _call(run_export, ExportConfig, draft=paths["run"], format="vllm",
                                       out=paths["export"], chain=cfg.chain))

    def doctor():
        checks = diagnose(build_config(DoctorConfig, dict(target=cfg.target, data=str(paths["prepared"]),
                                                         draft=paths["export"], store=paths.get("store"),
                                                         cache_dir=cfg.cache_dir)))
        print(render_table(checks))
        return {"ok": not any(c.status == "fail" for c in checks), "checks": [asdict(c) for c in checks]}

    doc = step("doctor", doctor)
    summary = _summary(cfg, device, paths, times, regen and regen["openings"], regen and regen["self"], prep, ext,
                       tr, ev, exp, doc)
    summary["train_warm_background"] = r.state.get("train_warm")
    report = write_report(out, summary, paths)
    summary["report"] = str(report)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return {**summary, "left": [], "files": {"summary": str(out / "summary.json"), "report": str(report)}}


def _timed(name: str, fn):
    print(f"\n=== {name} ===", flush=True)
    t0 = time.perf_counter()
    result = fn()
    print(f"--- {name}: {round(time.perf_counter() - t0, 1)} s", flush=True)
    return result


def _regenerate(cfg: DemoConfig, device: str, data: Path, paths: dict[str, Path], cache) -> dict:
    """The openings, then the self-written prompts, answered by the target: {openings, self, data (their union)}."""
    gen = dict(target=cfg.target, backend=cfg.regen_backend, max_new_tokens=cfg.regen_max_new_tokens,
               batch_size=cfg.regen_batch_size, device=device, overwrite=cfg.overwrite,
               max_prompt_tokens=cfg.regen_max_prompt_tokens or cfg.max_length // 2,
               cache_dir=cache, seed=cfg.seed, json=True, dtype="bf16" if fast_bf16(device) else "auto",
               **({"attention": cfg.regen_attention} if cfg.regen_backend == "native" else {}))
    openings = _opening_turns(data, paths["regenerated"] / "openings.jsonl", cfg.max_samples, cache)
    regen = _call(regenerate, RegenerateConfig, data=str(openings), max_samples=cfg.max_samples,
                  out=paths["regenerated"] / "conversations.jsonl", **gen)
    parts = [paths["regenerated"] / "conversations.jsonl"]
    print(json.dumps(regen, default=str)[:400])
    regen_self = None
    if cfg.self_prompts:
        regen_self = _call(regenerate, RegenerateConfig, data=f"self:{cfg.self_prompts}",
                           out=paths["regenerated"] / "self.jsonl", **gen)
        parts.append(paths["regenerated"] / "self.jsonl")
        print(json.dumps(regen_self, default=str)[:400])
    union = _union(parts, paths["regenerated"] / "union.jsonl") if len(parts) > 1 else parts[0]
    return {"openings": regen, "self": regen_self, "data": str(union)}


def _opening_turns(data: Path, out: Path, n: int, cache) -> Path:
    """The first `n` usable conversations cut to their opening exchange (with any system prompt).

    Regeneration answers turn by turn, so whole ShareGPT conversations (often 5+ turns) cost several
    sequential generate rounds each; the opening turn keeps the demo's regeneration to one round.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with open(out, "w") as f:
        for rec in iter_conversations(data, cache=cache, skip_leading_assistant=True):
            if not rec.messages:
                continue
            first_user = next((i for i, m in enumerate(rec.messages) if m["role"] == "user"), None)
            if first_user is None:
                continue
            # Keep the original first answer too: sources reject conversations without one, and
            # regeneration replaces it with the target's own answer anyway.
            f.write(json.dumps({"id": rec.id, "messages": rec.messages[:first_user + 2]}) + "\n")
            kept += 1
            if kept >= n:
                break
    return out


def _union(parts: list[Path], out: Path) -> Path:
    """The regenerated files one after another (prepare reads one file; each row keeps its own id)."""
    with open(out, "w", encoding="utf-8") as f:
        for p in parts:
            with open(p, encoding="utf-8") as src:
                f.writelines(line.rstrip("\n") + "\n" for line in src if line.strip())
    return out


def _chain_result(ev: dict) -> dict:
    """The chain row of an eval result (eval reports one entry per decode setting, the chain first)."""
    for r in ev.get("results", [ev]):
        if "tau" in r:
            return r
    raise KeyError("eval result has no tau")


# Greedy identity and what explains each divergence (tie rule, then the fp32 recheck): a bare "identical 0.43" reads
# as lossy when every divergence is a bf16 tie or numerics (the GPU demo's bf16 eval).
_IDENTITY = ("identical_rate", "tie_aware_identical_rate", "unexplained_divergences", *COUNTS)


def _identity(x: dict) -> str:
    """'0.429 (tie-aware 0.952; 3 not ties: 3 numerics)', or the bare rate where no tie rule ran (T > 0)."""
    if x.get("tie_aware_identical_rate") is None:
        return _fmt(x.get("identical_rate"))
    why = ", ".join(f"{x[k]} {k.removeprefix('unexplained_')}" for k in COUNTS if x.get(k))
    return (f"{_fmt(x.get('identical_rate'))} (tie-aware {_fmt(x['tie_aware_identical_rate'])}; "
            f"{x.get('unexplained_divergences') or 0} not ties{': ' + why if why else ''})")


def _tree_result(ev: dict) -> dict | None:
    """The tree row, when --tree was evaluated too: τ, acceptance, speedup (the chain's fields, for the tree)."""
    trees = [r for r in ev.get("results", []) if str(r.get("setting", "")).startswith("tree")]
    if not trees:
        return None
    t = trees[0]
    return {k: t.get(k) for k in ("setting", "tau", "accept_per_position", "tokens_per_s", "speedup", *_IDENTITY)}


def preflight(cfg: DemoConfig, out: Path) -> None:
    """Every input the demo will need, checked before its first stage: a missing benchmark file or a
    misspelt target must not surface after regenerate, extract and train have run."""
    problems = []
    t = str(cfg.target)
    if t not in BUILTIN_TARGETS and not Path(t).exists() and not (t.count("/") == 1 and not t.startswith((".", "/"))):
        problems.append(f"--target {t}: not a built-in name ({', '.join(BUILTIN_TARGETS)}), an existing path "
                        "or a hub id (org/name)")
    if str(cfg.data) not in BUILTIN_DATASETS and not Path(cfg.data).is_file():
        problems.append(f"--data {cfg.data}: no such file (or a built-in name: {', '.join(BUILTIN_DATASETS)})")
    try:
        load_bench(cfg.bench, limit=cfg.eval_per_category)
    except (FileNotFoundError, ValueError) as e:
        problems.append(f"--bench {cfg.bench}: {e}")
    try:
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        problems.append(f"--out {out}: not writable ({e.strerror})")
    try:
        import matplotlib  # noqa: F401  (the report's plots)
    except ImportError:
        problems.append("matplotlib is not installed (the report's plots need it): pip install matplotlib")
    if cfg.self_prompts and not cfg.regenerate:
        problems.append(f"--self-prompts {cfg.self_prompts} needs --regenerate: the self-written rows join the "
                        "regenerated ones (the raw set is another format)")
    if problems:
        raise ValueError("the demo cannot run; nothing was started:\n  " + "\n  ".join(problems))


def _failures(errors_file: Path) -> dict[str, int]:
    """Failed rows by reason (the text before the first ':'), from a regenerate errors file."""
    counts: dict[str, int] = {}
    if errors_file.is_file():
        for line in filter(str.strip, errors_file.read_text(encoding="utf-8").split("\n")):
            reason = str(json.loads(line).get("error", "unknown")).split(":", 1)[0]
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def _summary(cfg, device, paths, times, regen, regen_self, prep, ext, tr, ev, exp, doc) -> dict:
    r = _chain_result(ev)
    held = tr.get("eval") or {}
    rows = {"requested": cfg.max_samples}
    if regen is not None:
        rows.update(regenerated=regen.get("written"), regenerate_failed=regen.get("failed"),
                    regenerate_failed_by_reason=_failures(Path(regen.get("errors", ""))))
    if regen_self is not None:
        rows.update(self_prompts=cfg.self_prompts, self_answered=regen_self.get("written"))
    gen = [g for g in (regen, regen_self) if g]
    rows.update(prepare_in=prep.get("rows_in"), prepare_kept=prep.get("rows_out"),
                prepare_rejected=prep.get("rows_rejected"), prepare_rejected_by_reason=prep.get("rejected_by_reason"),
                packed_rows=prep.get("packed_rows"))
    return {
        "target": cfg.target, "device": device, "samples": cfg.max_samples, "rows": rows,
        "tokens": prep.get("tokens"), "masked_tokens": prep.get("masked_tokens"),
        "draft_vocab_coverage": prep.get("coverage"),
        "train": {k: v for k, v in tr.items() if isinstance(v, (int, float, str))},
        "train_steps": tr.get("steps"), "ttt_steps": cfg.ttt_steps, "chain": cfg.chain,
        "train_from": "online (no store)" if cfg.online else "store",
        "held_out_tau": tr.get("best_tau"), "held_out_positions": held.get("positions"),
        "tau": r["tau"], "accept_per_position": r.get("accept_per_position"),
        "tokens_per_s": r.get("tokens_per_s"), "baseline_tokens_per_s": r.get("baseline_tokens_per_s"),
        "speedup": r.get("speedup"), **{k: r.get(k) for k in _IDENTITY}, "tree": _tree_result(ev),
        "speedup_vs_vllm_ar": r.get("speedup_vs_vllm_ar"),
        "vllm_expected": expected_in_vllm(ev.get("vllm_reference"), cfg.chain, r["tau"]),
        "eval_questions": ev.get("questions"), "eval_max_new_tokens": cfg.eval_max_new_tokens,
        "doctor": {"ok": bool(doc.get("ok")), "fails": [c for c in doc.get("checks", []) if c.get("status") == "fail"]},
        "generated_tokens": sum(g.get("generated_tokens") or 0 for g in gen) if gen else None,
        "eval_seconds": {x.get("setting"): x.get("seconds") for x in ev.get("results", [])},
        "eval_warm_background": ev.get("warm_background"),
        "seconds": times, "total_seconds": round(sum(times.values()), 1),
        "paths": {k: str(v) for k, v in paths.items()},
    }


def _warm_line(wb: dict) -> str:
    if not wb.get("started"):
        return "not started (no draft was written while training ran)"
    warmed = ", ".join(f"{k} {v} s" for k, v in (wb.get("warm") or {}).items())
    return (f"started {wb['started_at_s']} s into training, done {wb['ended_at_s']} s after its start (rc {wb['rc']}"
            f"{', stopped at the eval' if wb['killed'] else ''}){'; ' + warmed if warmed else ''}")


def _rows_line(rows: dict) -> str:
    """'160 read, 143 regenerated (17 failed: prompt_too_long 17), 140 kept by prepare (3 rejected: ...)'."""
    def why(d):
        return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"

    parts = [f"{rows['requested']} read"]
    if "regenerated" in rows:
        parts.append(f"{rows['regenerated']} regenerated" + (
            f" ({rows['regenerate_failed']} failed: {why(rows['regenerate_failed_by_reason'])})"
            if rows["regenerate_failed"] else ""))
    if "self_answered" in rows:
        parts.append(f"{rows['self_answered']} of {rows['self_prompts']} self-written prompts answered")
    parts.append(f"{rows['prepare_kept']} kept by prepare" + (
        f" ({rows['prepare_rejected']} rejected: {why(rows['prepare_rejected_by_reason'])})"
        if rows["prepare_rejected"] else ""))
    return ", ".join(parts) + f" -> {rows['packed_rows']} packed rows"


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _print_table(s: dict) -> None:
    rows = [("target", s["target"]), ("device", s["device"]), ("conversations", _rows_line(s["rows"])),
            ("train tokens (masked)", f"{s['tokens']} ({s['masked_tokens']})"),
            ("draft vocab coverage", _fmt(s["draft_vocab_coverage"])),
            ("training", f"{s['train_steps']} steps, TTT {s['ttt_steps']}, from {s['train_from']}; held-out simulated τ "
                         f"{_fmt(s['held_out_tau'])}"),
            (f"τ (chain {s['chain']})", f"{s['tau']:.3f} on {s['eval_questions']} questions, "
                                        f"{s['eval_max_new_tokens']} new tokens each"),
            ("accept per position", ", ".join(f"{a:.2f}" for a in s["accept_per_position"] or [])),
            ("tokens/s spec | baseline", f"{s['tokens_per_s']:.1f} | {s['baseline_tokens_per_s']:.1f}"),
            ("speedup", f"{s['speedup']:.2f}x"), ("identical to greedy", _identity(s)),
            *([(f"τ ({t['setting']})", f"{t['tau']:.3f}, speedup {_fmt(t['speedup'], '.2f')}x, identical to greedy "
                                       f"{_identity(t)}")] if (t := s.get("tree")) else []),
            ("expected in vLLM", expectation_line(s.get("vllm_expected"), s["target"])),
            ("doctor", "pass" if s["doctor"]["ok"] else f"FAIL: {s['doctor']['fails']}"),
            ("stage seconds", ", ".join(f"{k} {v}" for k, v in s["seconds"].items())),
            ("total seconds", s["total_seconds"])]
    rows += [(f"out: {k}", v) for k, v in s["paths"].items()] + [("report", s["report"])]
    w = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"{k:<{w}}  {v}" for k, v in rows))


def write_report(out: Path, s: dict, paths: dict[str, Path]) -> Path:
    """One page: the numbers, where the rows and the time went, the learning curve and the eval plots."""
    from eyas.decode.plots import plot_learning_curve

    curve = plot_learning_curve(paths["run"] / "metrics.jsonl", out / "learning_curve.png")
    pngs = sorted(p.relative_to(out) for p in paths["eval"].glob("*.png"))
    lines = ["# eyas demo report", "",
             f"Target `{s['target']}` on {s['device']}; conversations: {_rows_line(s['rows'])}; "
             f"{s['tokens']} training tokens ({s['masked_tokens']} assistant).", "",
             "| metric | value |", "|---|---|",
             f"| training steps (TTT steps) | {s['train_steps']} ({s['ttt_steps']}) |",
             f"| trained from | {s['train_from']} |",
             f"| held-out simulated τ (chain {s['chain']}, best checkpoint) | {_fmt(s['held_out_tau'])} |",
             f"| τ (chain {s['chain']}), {s['eval_questions']} questions × {s['eval_max_new_tokens']} new tokens "
             f"| {s['tau']:.3f} |",
             f"| acceptance by position | {', '.join(f'{a:.2f}' for a in s['accept_per_position'] or [])} |",
             f"| tokens/s (spec / baseline) | {s['tokens_per_s']:.1f} / {s['baseline_tokens_per_s']:.1f} |",
             f"| speedup | {s['speedup']:.2f}× |", f"| identical to greedy baseline | {_identity(s)} |",
             *([f"| τ ({t['setting']}) / speedup / identical | {t['tau']:.3f} / {_fmt(t['speedup'], '.2f')}× / "
                f"{_identity(t)} |"] if (t := s.get("tree")) else []),
             f"| speedup to expect in vLLM (chain {s['chain']}, batch 1) | "
             f"{expectation_line(s.get('vllm_expected'), s['target'])} |",
             f"| draft vocab coverage | {_fmt(s['draft_vocab_coverage'])} |",
             f"| doctor | {'pass' if s['doctor']['ok'] else 'FAIL'} |",
             "", "## Time by stage (s)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in s["seconds"].items()] + [f"| total | {s['total_seconds']} |", ""]
    evs = {k: v for k, v in (s.get("eval_seconds") or {}).items() if v}
    if evs:  # compiles and rechecks can outweigh the decoding itself: say which
        lines += ["Eval seconds by setting: " + "; ".join(
            f"{k}: " + ", ".join(f"{p} {x}" for p, x in v.items()) for k, v in evs.items()) + ".", ""]
    tw = s.get("train_warm_background")
    if tw:   # the training step's compiles done beside the data stages (--train-warm-background)
        lines += [f"Training warm-up beside the data stages: {tw['seconds']} s (rc {tw['rc']}"
                  f"{', stopped' if tw['killed'] else ''}); training waited {tw['waited_s']} s for it.", ""]
    wb = s.get("eval_warm_background")
    if wb:   # the eval's compiles done beside training (--eval-warm-background)
        lines += ["Eval warm-up beside training: " + _warm_line(wb) + ".", ""]
    if curve:
        lines += ["## Learning curve", "", f"![learning curve]({curve.name})", ""]
    if pngs:
        lines += ["## Evaluation", ""] + [f"![{p.stem}]({p.as_posix()})" for p in pngs] + [""]
    lines += ["## Outputs", ""] + [f"- {k}: `{v}`" for k, v in s["paths"].items()]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report

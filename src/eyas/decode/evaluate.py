"""`eyas eval`: run Spec-Bench (or any JSONL) through the AR baseline and speculative decoding.

Both use one TargetRunner (static slot cache; torch.compile mode="reduce-overhead", i.e. CUDA
graphs, on the GPU for the baseline step, the verify step and every draft step alike), so the
speedup compares equal optimisation levels. Greedy outputs are compared token for token.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

import torch
from pydantic import Field

from eyas import env
from eyas.config import StageConfig
from eyas.decode import baseline_cache as bcache, vllm_reference
from eyas.decode.bench import SPEC_BENCH, load_bench
from eyas.decode.costmodel import Costs, choose, covers, predict_from
from eyas.decode.divergence import logit_gap, recheck, recheck_lines
from eyas.decode.speculative import GenStats, SpecDecoder, ar_generate, warm_ar
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.devices import resolve_device, resolve_dtype
from eyas.flags import CacheDir, Device, JsonSwitch, ModelDtype, ResultsFile, Target, TrustRemoteCode
from eyas.draft.io import load_draft, read_draft_config, read_draft_meta, target_problems
from eyas.draft.kinds import get_kind
from eyas.outputs import claim, input_id, write_result
from eyas.progress import Progress
from eyas.target import load_config, load_target, text_config
from eyas.target.special import target_special_ids

AUTO_PROBE = TreeSpec(total=80, depth=8, topk=10)   # recorded once; every smaller setting is replayed from it


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


def turn_prompt(tokenizer, question: dict, answers: list[list[int]]) -> list[int]:
    """Token ids for the next turn: earlier turns with the baseline's answers, through the chat template."""
    msgs = []
    for i, ans in enumerate(answers):
        msgs += [{"role": "user", "content": question["turns"][i]},
                 {"role": "assistant", "content": tokenizer.decode(ans, skip_special_tokens=True)}]
    msgs.append({"role": "user", "content": question["turns"][len(answers)]})
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer("\n\n".join(m["content"] for m in msgs))["input_ids"]


def _summary(stats: GenStats, base: GenStats, identical: list[bool]) -> dict:
    tps = stats.new_tokens / stats.t_total if stats.t_total else 0.0
    btps = base.new_tokens / base.t_total if base.t_total else 0.0
    other = max(0.0, stats.t_total - stats.t_prefill - stats.t_draft - stats.t_verify)
    return {"tau": stats.tau, "accept_per_position": stats.accept_per_position(), "steps": stats.steps,
            "new_tokens": stats.new_tokens, "tokens_per_s": tps, "baseline_tokens_per_s": btps,
            "speedup": tps / btps if btps else 0.0,
            "identical_rate": sum(identical) / len(identical) if identical else None,
            "time_s": {"total": stats.t_total, "prefill": stats.t_prefill, "draft": stats.t_draft,
                       "verify": stats.t_verify, "overhead": other, "baseline_total": base.t_total}}


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


# What the speculative decoder's own CUDA graphs capture: torch.compile'd steps (fused kernels) or
# eager ones (no compile time; the fallback if compilation misbehaves): EYAS_DECODE_INNER=eager.
# EYAS_DECODE_GRAPHS=0 runs the rounds without CUDA graphs (diagnosis).
_INNER = env.get("EYAS_DECODE_INNER")
_GRAPHS = env.get("EYAS_DECODE_GRAPHS") != "0"
# The target attends over a power-of-two bucket of the KV cache from this size up. Each bucket is one more
# compile per step width at warm-up (~20 s each for SmolLM2 on an H200), so the default keeps them few
# (Spec-Bench's capacity at 512 new tokens is 2049: buckets 1024 and 2049); EYAS_DECODE_MIN_BUCKET=1000000
# attends over the whole capacity (the pre-bucket behaviour), smaller values give finer buckets.
_MIN_BUCKET = int(env.get("EYAS_DECODE_MIN_BUCKET"))


class Session:
    """A loaded target + draft with one runner; generates baselines once and evaluates settings."""

    def __init__(self, target, draft, questions, *, max_new_tokens, temperature=0.0, device=None,
                 compile_graphs=None, seed=0, reuse: dict | None = None, baseline_cache: Path | None = None,
                 min_bucket: int | None = None):
        self.target, self.draft, self.questions = target, draft, questions
        self.min_bucket = min_bucket or _MIN_BUCKET
        self.baseline_cache, self._cache_key, self.cached_turns = baseline_cache, None, 0
        self.cache_check: dict | None = None   # the cached baseline's re-timing here (bcache.retime)
        self.max_new, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.device = target.layout.lm_head.weight.device if device is None else torch.device(device)
        self.compile = (self.device.type == "cuda") if compile_graphs is None else compile_graphs
        self.eos = set(target_special_ids(target).stop)   # what vLLM is told to stop on too
        # Prompt lengths are only known turn by turn; size the caches for the longest first turn plus
        # every turn's answer, and grow (rebuilding the runner) if a later turn needs more.
        longest = max(len(turn_prompt(target.tokenizer, {"turns": q["turns"]}, [])) + sum(len(t) for t in q["turns"][1:])
                      for q in questions)
        turns = max(len(q["turns"]) for q in questions)
        self.capacity = longest + turns * (max_new_tokens + 64) + 128
        # `reuse` (a dict the caller keeps) shares the compiled runner and proposers between sessions of the
        # same target, draft and capacity, e.g. one per temperature: nothing in them depends on the temperature,
        # and each (width, KV bucket) compile costs ~20 s on an H200
        self._reuse = reuse if reuse is not None else {}
        key = (id(target.model), id(draft), self.capacity, self.compile, _INNER, self.min_bucket)
        if self._reuse.get("key") != key:
            self._reuse.clear()
            self._reuse.update(key=key, runner=None, proposers={}, ar_warm=set())
        if self._reuse["runner"] is None:
            runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, self.capacity,
                                  min_bucket=self.min_bucket)
            if self.compile:
                runner.compile()
                if _INNER == "compiled":
                    runner.compile_inner()
            self._reuse["runner"] = runner
        self.runner: TargetRunner = self._reuse["runner"]
        self.baseline: dict[tuple, tuple[list[int], GenStats]] = {}
        self._warm_specs: set = set()   # settings whose round this session compiled/captured at every bucket

    def _gen(self, key):
        return torch.Generator().manual_seed(zlib.crc32(repr((self.seed,) + key).encode()))

    def _timed_turn(self, key: tuple) -> tuple[list[int], GenStats]:
        """A first turn's baseline, decoded and timed in this process (the baseline cache's check)."""
        q = next(q for q in self.questions if q["question_id"] == key[0])
        prompt = turn_prompt(self.target.tokenizer, q, [])
        return ar_generate(self.runner, prompt, self.max_new, temperature=self.temperature, eos_ids=self.eos,
                           generator=self._gen(key))

    def turns(self) -> int:
        return sum(len(q["turns"]) for q in self.questions)

    def prompts(self):
        """(category, key, prompt ids) per turn; later turns use the baseline's answers as history."""
        if self.baseline_cache is not None and self._cache_key is None:
            self._cache_key = bcache.cache_key(self, {"compile": self.compile, "inner": _INNER, "graphs": _GRAPHS,
                                                      "min_bucket": self.min_bucket})
            cached = bcache.load(self.baseline_cache, self._cache_key)
            if cached:   # its timings are only used once this process has timed one of its turns alike
                self.cache_check = bcache.retime(cached, self._timed_turn)
                if self.cache_check["used"]:
                    self.baseline.update(cached)
                    self.cached_turns = len(cached)
        made = len(self.baseline)
        todo = self.turns() - sum(1 for q in self.questions for t in range(len(q["turns"]))
                                  if (q["question_id"], t) in self.baseline)
        bar = Progress("eval: greedy baseline", todo, "turns", enabled=todo > 0)
        for q in self.questions:
            answers: list[list[int]] = []
            for t in range(len(q["turns"])):
                key = (q["question_id"], t)
                prompt = turn_prompt(self.target.tokenizer, q, answers)
                if key not in self.baseline:
                    self.baseline[key] = ar_generate(self.runner, prompt, self.max_new, temperature=self.temperature,
                                                     eos_ids=self.eos, generator=self._gen(key),
                                                     graphs=self.compile and _GRAPHS)
                    bar.update(1)
                yield q["category"], key, prompt
                answers.append(self.baseline[key][0])
        bar.close()
        if self.baseline_cache is not None and len(self.baseline) > made:
            bcache.save(self.baseline_cache, self._cache_key, self.baseline)

    def warmup(self, spec: TreeSpec | None) -> None:
        """Compile/capture every static shape outside the timed region: a short generation of each,
        then the target step and the round at every KV bucket (compiled once per runner / decoder)."""
        q = self.questions[0]
        prompt = turn_prompt(self.target.tokenizer, q, [])
        for _ in range(2 if self.compile else 0):  # eager needs no warm-up
            ar_generate(self.runner, prompt, min(16, self.max_new), eos_ids=(), temperature=self.temperature,
                        graphs=self.compile and _GRAPHS)
            if spec is not None:
                self.decoder(spec).generate(prompt, min(3 * spec.depth + 4, self.max_new))
        if self.compile and (self.temperature > 0) not in self._reuse["ar_warm"]:  # greedy and sampled steps
            warm_ar(self.runner, graphs=_GRAPHS, temperature=self.temperature)
            self._reuse["ar_warm"].add(self.temperature > 0)
        if self.compile and spec is not None and spec not in self._warm_specs:
            self.decoder(spec).warm(prompt)
            self._warm_specs.add(spec)

    def decoder(self, spec: TreeSpec, record: bool = False) -> SpecDecoder:
        """One decoder (static buffers, CUDA graphs captured on first use) per setting, kept."""
        if not hasattr(self, "_decoders"):
            self._decoders = {}
        key = spec  # record only changes what the host reads: the captured graphs are shared
        if key not in self._decoders:
            p = self._reuse["proposers"].get(spec)
            if p is None:
                proposer = get_kind(self.draft.config).proposer
                p = self._reuse["proposers"][spec] = proposer(self.draft, spec, self.capacity)
                if self.compile and _INNER == "compiled":
                    p.compile_inner()
            self._decoders[key] = SpecDecoder(self.runner, p, temperature=self.temperature, eos_ids=self.eos,
                                              graphs=self.compile and _GRAPHS)
        self._decoders[key].record_rounds = record
        return self._decoders[key]

    def run(self, spec: TreeSpec, record: bool = False, recheck_n: int = 0) -> tuple[dict, GenStats]:
        """One setting over every turn. recheck_n: greedy divergences that are not ties to recheck (divergence.py).
        The result's `seconds` say where the wall time went: warm-up (compiles and graph captures), the AR
        baseline (only the first setting makes it), the speculative decoding, the rechecks."""
        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return round(clock[-1] - clock[-2], 2)

        self.warmup(spec)
        dec = self.decoder(spec, record)
        seconds = {"warm": lap()}
        base_all, spec_all, same_all = GenStats(), GenStats(), []
        cats: dict[str, tuple[GenStats, GenStats, list[bool]]] = {}
        divergences, diverged, turns = [], {}, []
        todo = list(self.prompts())
        seconds["baseline"] = lap()
        bar = Progress(f"eval: {spec.label()}", len(todo), "turns")
        for cat, key, prompt in todo:
            ref, bst = self.baseline[key]
            out, st = dec.generate(prompt, self.max_new, generator=self._gen(key))
            spec_all.add(st)
            bar.update(1)
            bar.note(f"τ {spec_all.tau:.2f}")
            same = out == ref
            # per turn, so any subset's tau (sum emitted / sum steps) and the worst prompts can be read back
            turns.append({"question_id": key[0], "turn": key[1], "category": cat, "steps": st.steps,
                          "emitted": st.emitted, "new_tokens": st.new_tokens,
                          **({"identical": same} if self.temperature <= 0 else {})})
            if not same and self.temperature <= 0:
                divergences.append({"question_id": key[0], "turn": key[1], "category": cat,
                                    **logit_gap(self.runner, prompt, ref, out)})
                diverged[key] = (prompt, out)
            c = cats.setdefault(cat, (GenStats(), GenStats(), []))
            for agg, s in ((c[0], st), (c[1], bst), (base_all, bst)):
                agg.add(s)
            c[2].append(same)
            same_all.append(same)
        bar.close()
        seconds["decode"] = lap()
        greedy = self.temperature <= 0
        result = {"setting": spec.label(), "seconds": seconds,
                  "decode": {"total": spec.total, "depth": spec.depth, "topk": spec.topk,
                             "max_new_tokens": self.max_new, "temperature": self.temperature,
                             "compiled": self.compile, "dtype": str(self.runner.dtype),
                             "kv_buckets": list(self.runner.buckets)},
                  **_summary(spec_all, base_all, same_all if greedy else []),
                  "per_category": {k: _summary(s, b, i if greedy else []) for k, (s, b, i) in cats.items()},
                  "divergences": divergences, "turns": turns}
        if greedy and same_all:  # identity up to logit ties (must be 1.0; exactly identical in fp32)
            ties = sum(bool(d.get("tie")) for d in divergences)
            result["tie_aware_identical_rate"] = (sum(same_all) + ties) / len(same_all)
            result["unexplained_divergences"] = len(divergences) - ties
            if recheck_n > 0:  # after the timed loop: the same target, draft and prompts are still at hand
                result.update(recheck(self, spec, divergences, diverged, recheck_n))
                seconds["recheck"] = lap()
        return result, spec_all

    def ar_step(self) -> float:
        """Measured baseline seconds per generated token (decode only, prefill excluded)."""
        tot = GenStats()
        for _, b in self.baseline.values():
            tot.add(b)
        return (tot.t_total - tot.t_prefill) / max(1, tot.new_tokens - len(self.baseline))


def evaluate(target, draft, questions, *, chain=None, tree=None, max_new_tokens=512, temperature=0.0, device=None,
             compile_graphs=None, seed=0, session: Session | None = None) -> dict:
    """One setting (chain K, or tree: TreeSpec / 'total=..,depth=..,topk=..') over `questions`.
    `target`: eyas Target or spec string; `draft`: a draft model (any kind) or a draft dir. Returns the result dict
    (tau, accept_per_position, tokens_per_s, baseline_tokens_per_s, speedup, identical_rate, per_category, ...)."""
    if (chain is None) == (tree is None):
        raise ValueError("evaluate: give exactly one of chain=K or tree=...")
    spec = TreeSpec.chain(int(chain)) if chain is not None else (tree if isinstance(tree, TreeSpec)
                                                                  else TreeSpec.parse(str(tree)))
    if session is None:
        target, draft = load_pair(target, draft, device, None)
        session = Session(target, draft, questions, max_new_tokens=max_new_tokens, temperature=temperature,
                          device=device, compile_graphs=compile_graphs, seed=seed)
    result, _ = session.run(spec)
    return result


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
                baseline_cache=cfg.baseline_cache, min_bucket=cfg.min_bucket)
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
        auto = _calibrate(cfg, target, draft, costs, probe)
        by_spec.append((AUTO_PROBE, probe))
        specs.append(auto["chosen"])
    elif cfg.tree:
        specs.append(TreeSpec.parse(cfg.tree))
    if cfg.warm_only:
        return _warm_only(cfg, s, specs)
    results = []
    for spec in specs:
        res, st = s.run(spec, record=cfg.temperature <= 0, recheck_n=cfg.recheck)
        costs.ar_step = s.ar_step()
        costs.add_run(spec, st)
        by_spec.append((spec, st.rounds))
        results.append(res)
    hw = hardware(s.device)
    ref = vllm_reference.lookup(target.model.config, hw.get("gpu"), str(s.runner.dtype), batch=1)
    for r in results:   # eyas's speed over vLLM's AR for the same architecture, GPU and dtype, where measured
        r["speedup_vs_vllm_ar"] = vllm_reference.versus(r["tokens_per_s"], ref)
    out = {"target": cfg.target, "draft": str(cfg.draft), "bench": cfg.bench, "questions": len(questions),
           "hardware": hw, "commit": commit(), "results": results, "vllm_reference": ref, "warnings": warnings,
           "baseline": {"turns": len(s.baseline), "from_cache": s.cached_turns,
                        "cache": str(cfg.baseline_cache) if cfg.baseline_cache else None,
                        "cache_check": s.cache_check}}
    if cfg.temperature <= 0 and any(rounds for _, rounds in by_spec):
        out["cost_model"] = {"costs": costs.to_dict(),
                             "predicted_vs_measured": _predicted_vs_measured(by_spec, results, costs)}
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


def pairing_warnings(cfg: EvalConfig, target, questions: list[dict]) -> list[str]:
    """What makes the numbers describe something else than asked, each printed as it is found: a draft trained for
    other target weights, a prompt past the target's context. A prompt that cannot fit at all is refused."""
    out = []
    trained = (read_draft_meta(cfg.draft).get("target") or {})
    have = trained.get("sha256") if isinstance(trained, dict) else None
    now = input_id(cfg.target, cache=cfg.cache_dir).get("sha256")
    if have and now and have != now:
        out.append(f"the draft was trained for target {trained.get('name')} (content {have[:12]}), not for "
                   f"--target {cfg.target} (content {now[:12]}): its τ and speedup describe a pairing it was not "
                   f"made for")
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


def table(out: dict) -> str:
    """The human summary: one row per decode setting, then τ by category (the JSON has everything)."""
    ref, hw = out.get("vllm_reference"), out.get("hardware", {})
    rows = [("setting", "τ", "accept by position", "tok/s", "AR tok/s", "speedup", *(("vs vLLM AR",) if ref else ()),
             "identical")]
    b = out.get("baseline") or {}
    mark = "*" if b.get("from_cache") else ""
    for r in out["results"]:
        ident = r.get("identical_rate")
        vs = (f"{r['speedup_vs_vllm_ar']:.2f}x",) if ref else ()
        rows.append((r["setting"], f"{r['tau']:.3f}", " ".join(f"{a:.2f}" for a in r["accept_per_position"]),
                     f"{r['tokens_per_s']:.1f}", f"{r['baseline_tokens_per_s']:.1f}{mark}", f"{r['speedup']:.2f}x", *vs,
                     "-" if ident is None else f"{ident:.2f}"))
    cats = sorted({c for r in out["results"] for c in r["per_category"]})
    lines = [f"{out['questions']} questions from {out['bench']}, target {out['target']}, draft {out['draft']}", ""]
    lines += _columns(rows) + [vllm_reference.reference_line(ref, hw.get("gpu") or hw.get("device"))]
    lines += [line for line in [baseline_line(b)] if line] + [""]
    crow = [("category",) + tuple(r["setting"] for r in out["results"])]
    crow += [(c,) + tuple(f"{r['per_category'][c]['tau']:.2f}" if c in r["per_category"] else "-"
                          for r in out["results"]) for c in cats]
    lines += ["τ by category:"] + _columns(crow)
    rechecks = [line for r in out["results"] for line in recheck_lines(r)]
    if rechecks:
        lines += [""] + rechecks
    if out.get("plots"):
        lines += ["", "plots: " + ", ".join(out["plots"])]
    return "\n".join(lines)


def baseline_line(b: dict) -> str:
    """Where the AR baseline came from, when it was not simply decoded here."""
    check = b.get("cache_check") or {}
    if b.get("from_cache"):
        return (f"* AR baseline: {b['from_cache']} of {b['turns']} turns from the cache {b.get('cache')}; their timings "
                f"held when this process timed turn {check.get('question_id')}/{check.get('turn')} again "
                f"({check.get('apart', 0):.0%} apart)")
    if check:
        why = "other tokens" if not check.get("same_tokens") else f"{check.get('apart', 0):.0%} apart"
        return (f"AR baseline: timed here; the cached one was not used (its turn {check.get('question_id')}/"
                f"{check.get('turn')} timed again here: {why})")
    return ""


def _columns(rows: list[tuple]) -> list[str]:
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(f"{str(c):<{w[i]}}" for i, c in enumerate(r)).rstrip() for r in rows]


def _predicted_vs_measured(by_spec, results: list[dict], costs: Costs) -> list[dict]:
    """Per measured setting: replayed from its own rounds (checks the time model; τ matches by construction),
    then from every other recorded setting that covers it (a held-out check of the acceptance replay too)."""
    out = []
    for r in results:
        spec = _spec_of(r)
        own = [sr for sr in by_spec if sr[0] == spec][:1]
        sources = own + [sr for sr in by_spec if sr[0] != spec and covers(sr[0], spec)]
        for src in sources:
            out.append({"measured_speedup": r["speedup"], "measured_tau": r["tau"], **predict_from([src], spec, costs)})
    return out


def _spec_of(result: dict) -> TreeSpec:
    d = result["decode"]
    return TreeSpec(total=d["total"], depth=d["depth"], topk=d["topk"])


def _calibrate(cfg, target, draft, costs: Costs, recorded: list) -> dict:
    """Record a large tree and a chain on `calib` questions per category, then pick by predicted speedup."""
    qs = load_bench(cfg.bench, cfg.categories, cfg.calib)
    s = Session(target, draft, qs, max_new_tokens=min(cfg.max_new_tokens, 128), temperature=0.0,
                compile_graphs=cfg.compile, seed=cfg.seed, min_bucket=cfg.min_bucket)
    for spec in (TreeSpec.chain(3), AUTO_PROBE):
        _, st = s.run(spec, record=True)
        costs.add_run(spec, st)
        if spec == AUTO_PROBE:
            recorded.extend(st.rounds)
    costs.ar_step = s.ar_step()
    chosen, preds = choose(recorded, costs)
    return {"chosen": chosen, "predictions": preds}

"""The evaluation session: one loaded target + draft, the AR baseline of every turn, and each decode setting
run over the same prompts.

The baseline and speculative decoding share one TargetRunner (static slot cache; torch.compile
mode="reduce-overhead", i.e. CUDA graphs, on the GPU for the baseline step, the verify step and every
draft step alike), so the speedup compares equal optimisation levels. Greedy outputs are compared token
for token.
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import torch

from eyas import env
from eyas.decode import baseline_cache as bcache
from eyas.decode.divergence import logit_gap, recheck
from eyas.decode.speculative import GenStats, SpecDecoder, ar_generate, warm_ar
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.kinds import get_kind
from eyas.progress import Progress
from eyas.target.special import target_special_ids


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
            "time_s": {"total": stats.t_total, "prefill": stats.t_prefill,
                       "prefill_parts": {"target": stats.t_prefill_target, "catchup": stats.t_prefill_catchup,
                                         "first_tree": stats.t_prefill_tree},
                       "draft": stats.t_draft, "verify": stats.t_verify, "overhead": other,
                       "baseline_total": base.t_total, "baseline_prefill": base.t_prefill}}


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
                 min_bucket: int | None = None, shared: bool = False):
        self.target, self.draft, self.questions = target, draft, questions
        # shared: other work runs on the device meanwhile; tokens and tau hold, no timing does (bcache marks it)
        self.shared, self._cache_shared = shared, False
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
        self._owns_runner = reuse is None   # a caller's `reuse` keeps the runner for the next session
        key = (id(target.model), id(draft), self.capacity, self.compile, _INNER, self.min_bucket)
        if self._reuse.get("key") != key:
            if self._reuse.get("runner") is not None:
                self._reuse["runner"].close()   # a runner for another key: its hooks off the target now (see close)
            self._reuse.clear()
            self._reuse.update(key=key, runner=None, proposers={}, ar_warm=set())
        if self._reuse["runner"] is None:
            runner = TargetRunner(target.model, target.layout, draft.config.aux_layer_ids, self.capacity,
                                  min_bucket=self.min_bucket)
            if self.compile:
                runner.compile()
                if _INNER == "compiled":
                    runner.compile_inner()
            else:
                runner.graph_prefill = False   # eager means eager: nothing captured on first use in a timed turn
            self._reuse["runner"] = runner
        self.runner: TargetRunner = self._reuse["runner"]
        self.baseline: dict[tuple, tuple[list[int], GenStats]] = {}
        self._warm_specs: set = set()   # settings whose round this session compiled/captured at every bucket

    def close(self) -> None:
        """Remove the runner's capture hooks now (a session of its own only). Dropping a session without it
        leaves them on the target until a garbage collection, which may come mid torch.compile trace of the next
        session's step: the hooks then change between trace and guards (dynamo's IndexError)."""
        if self._owns_runner and self._reuse.get("runner") is not None:
            self._reuse["runner"].close()
            self._reuse.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _gen(self, key):
        return torch.Generator().manual_seed(zlib.crc32(repr((self.seed,) + key).encode()))

    def _ar(self, prompt: list[int], key: tuple) -> tuple[list[int], GenStats]:
        return ar_generate(self.runner, prompt, self.max_new, temperature=self.temperature, eos_ids=self.eos,
                           generator=self._gen(key), graphs=self.compile and _GRAPHS)

    def _timed_turn(self, key: tuple, cached: dict) -> tuple[list[int], GenStats]:
        """A cached turn decoded and timed again in this process (the baseline cache's check); a later turn's
        history is the cached answers before it."""
        q = next(q for q in self.questions if q["question_id"] == key[0])
        return self._ar(turn_prompt(self.target.tokenizer, q, [cached[(key[0], t)][0] for t in range(key[1])]), key)

    def turns(self) -> int:
        return sum(len(q["turns"]) for q in self.questions)

    def prompts(self):
        """(category, key, prompt ids) per turn; later turns use the baseline's answers as history."""
        if self.baseline_cache is not None and self._cache_key is None:
            self._cache_key = bcache.cache_key(self, {"compile": self.compile, "inner": _INNER, "graphs": _GRAPHS,
                                                      "min_bucket": self.min_bucket, "grouped": self.runner.grouped})
            cached, shared = bcache.load(self.baseline_cache, self._cache_key)
            if cached and self.shared:   # no timing here is trusted: the cached tokens serve as they are
                self.cache_check = {"used": True, "shared": True}
            elif cached and shared:      # timed beside other work: this eval times alone, so it times afresh
                self.cache_check = {"used": False, "shared": True}
            elif cached:   # its timings are only used once this process has timed some of its turns alike
                self.cache_check = bcache.retime(cached, lambda k: self._timed_turn(k, cached))
            if self.cache_check and self.cache_check["used"]:
                self.baseline.update(cached)
                self.cached_turns = len(cached)
                self._cache_shared = shared
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
                    self.baseline[key] = self._ar(prompt, key)
                    bar.update(1)
                yield q["category"], key, prompt
                answers.append(self.baseline[key][0])
        bar.close()
        if self.baseline_cache is not None and len(self.baseline) > made:
            bcache.save(self.baseline_cache, self._cache_key, self.baseline, shared=self.shared or self._cache_shared)

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
                             "kv_buckets": list(self.runner.buckets),
                             # CUDA graphs still on after this setting (a failed capture turns them off for good)
                             "prefill_graphs": bool(self.runner.graph_prefill), "round_graphs": bool(dec.graphs),
                             "catchup_graphs": bool(dec.graphs and getattr(dec.proposer, "graph_prompt", False)
                                                    and not getattr(dec.proposer, "_prompt_graph_error", None))},
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

    def ar_prefill(self) -> float:
        """Measured baseline seconds of prefill per turn."""
        return sum(b.t_prefill for _, b in self.baseline.values()) / max(1, len(self.baseline))

    def ar_step(self) -> float:
        """Measured baseline seconds per generated token (decode only, prefill excluded)."""
        tot = GenStats()
        for _, b in self.baseline.values():
            tot.add(b)
        return (tot.t_total - tot.t_prefill) / max(1, tot.new_tokens - len(self.baseline))

"""Benchmark the native generator (`eyas regenerate --backend native`): generated tok/s, and agreement with HF.

    PYTHONPATH=src python bench/regen.py --data SHAREGPT.json --out bench/results/regen-h200.json   # ~2 min, H200
    PYTHONPATH=src python bench/regen.py --data sharegpt --rows 8 --batch 4 --max-new 16 --hf-sample 4 --out ...  # CPU

The first user turn of `--rows` ShareGPT rows is answered greedily by the target at batch `--batch`
(continuous batching, CUDA-graph decode step on cuda). tok/s counts generated tokens over the generation
wall time (the one-off CUDA-graph capture is reported apart). Then `--hf-sample` of the same prompts go through
HF `generate` (left-padded batches, static cache on cuda) and the token ids are compared: exact-match rate,
and for each differing row whether the first divergence is a tie — the two candidate tokens' logits (one
more unpadded forward of the target in its own dtype) within 2 bf16 ulps of each other, where batch shape
or kernel order alone can flip the argmax. `--sweep` times variants (batch, graph mode, SDPA backends, decode
attention sdpa/flex) on the same prompts and says whether each gave the main run's answers. Writes JSON to --out.

Every divergence also records the signed gap logit(HF token) - logit(native token) under the reference forward
(> 0: the reference sides with HF), the reference's own argmax and which engine chose it. A divergence that is not
a tie (up to `--attribute` rows) is then re-generated alone, batch 1 and no padding, by both engines: a batched
answer that its own engine does not repeat alone, while the lone run takes the other engine's token, is that
batched run's doing (`alone.side`); when both engines repeat themselves alone, the reference argmax decides
(`alone.basis`). `match.unexplained_{hf,native}_side` / `unexplained_undecided` count the verdicts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path
from _emit import emit  # noqa: E402

from eyas.data.generate import Generator, NativeBackend
from eyas.decode.divergence import TIE_ULPS, ulp
from eyas.data.sources import iter_conversations


def first_turns(data: str, rows: int) -> list[list[dict]]:
    out = []
    for rec in iter_conversations(data, None):
        if rec.ok and rec.messages:
            users = [m for m in rec.messages if m["role"] == "user"]
            if users:
                out.append([m for m in rec.messages[:1] if m["role"] == "system"] + users[:1])
        if len(out) >= rows:
            break
    return out


def hf_generate(model, prompts: list[list[int]], max_new: int, eos: list[int], pad: int, batch: int,
                static: bool) -> list[list[int]]:
    res = []
    for b in range(0, len(prompts), batch):
        chunk = prompts[b:b + batch]
        w = max(map(len, chunk))
        ids = torch.full((len(chunk), w), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for r, p in enumerate(chunk):
            ids[r, w - len(p):], att[r, w - len(p):] = torch.tensor(p), 1
        kw = {"cache_implementation": "static"} if static else {}
        with torch.inference_mode():
            g = model.generate(input_ids=ids.to(model.device), attention_mask=att.to(model.device), do_sample=False,
                               max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad, **kw)
        for row in g[:, w:].tolist():
            k = next((i for i, t in enumerate(row) if t in eos), len(row))
            res.append(row[:k])
    return res


STOP = None  # token_at's answer where a sequence ended (EOS): a stop is a choice like any token


def token_at(ans: list[int], k: int) -> int | None:
    return ans[k] if k < len(ans) else STOP


def first_diff(x: list[int], y: list[int]) -> int | None:
    """The first position where two answers differ (one ending where the other goes on counts); None if equal."""
    if x == y:
        return None
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))


@torch.inference_mode()
def ref_logits(model, prompt: list[int], common: list[int]) -> torch.Tensor:
    """fp32 logits of the next token after prompt + common: one unpadded forward, batch 1, no cache."""
    x = torch.tensor([prompt + common], device=model.device)
    return model(input_ids=x).logits[0, -1].float()


def divergence(be, row: int, prompt: list[int], hf: list[int], native: list[int]) -> dict:
    """The first divergence of two answers under the reference forward of their common prefix: the signed gap
    logit(hf token) - logit(native token), whether it is a tie, the reference argmax and who chose it (hf, native,
    both at an exact tie, or neither)."""
    k = first_diff(hf, native)
    z = ref_logits(be.model, prompt, hf[:k])
    # a side that stopped there emitted an EOS; greedy, so the one the model ranks highest
    stop = max(be.eos, key=lambda e: z[e].item())
    a, b = (stop if t is STOP else t for t in (token_at(hf, k), token_at(native, k)))
    signed = z[a].item() - z[b].item()
    thr = TIE_ULPS * ulp(max(abs(z[a].item()), abs(z[b].item())), next(be.model.parameters()).dtype)
    # who picked the reference's top token (logits equal to the maximum count: exact bf16 ties are common)
    hf_top, native_top = z[a] == z.max(), z[b] == z.max()
    by = "both" if hf_top and native_top else "hf" if hf_top else "native" if native_top else "neither"
    top = a if hf_top else b if native_top else int(z.argmax())

    def tok(t):
        return {"id": t, "text": be.tok.decode([t]), "logit": round(z[t].item(), 4), "rank": int((z > z[t]).sum())}

    return {"row": row, "position": k, "gap": round(abs(signed), 4), "tie_threshold": round(thr, 4),
            "tie": abs(signed) <= thr, "signed_gap": round(signed, 4), "hf_token": tok(a), "native_token": tok(b),
            "ref_argmax": tok(top), "ref_argmax_by": by,
            "context": be.tok.decode(hf[max(0, k - 12):k]), "hf_next": be.tok.decode(hf[k:k + 12]),
            "native_next": be.tok.decode(native[k:k + 12])}


def lone_choice(lone: list[int], common: list[int], a, b) -> str:
    """What a lone run picks at the divergence (k = len(common)): the HF-batched token a ("hf"), the native one b
    ("native"), a third ("other"), or nothing ("earlier": it left the common prefix before k)."""
    if lone[:len(common)] != common:
        return "earlier"
    t = token_at(lone, len(common))
    return "hf" if t == a else "native" if t == b else "other"


def verdict(hf_alone: str, native_alone: str, ref_by: str) -> tuple[str, str | None]:
    """(side, basis). An engine whose lone run takes the other engine's token did not repeat its own batched
    answer: that batched run went wrong. When the lone runs settle nothing (each repeats itself, or both
    flip), the unpadded reference forward's argmax decides; when it is a third token (or both), nobody is named."""
    hf_off, native_off = hf_alone == "native", native_alone == "hf"
    if hf_off != native_off:
        return ("hf" if hf_off else "native"), "lone runs"
    if ref_by in ("hf", "native"):
        return ("native" if ref_by == "hf" else "hf"), "reference forward"
    return "undecided", None


CHOICE = {"hf": "takes HF-batched's token", "native": "takes native-batched's token", "other": "takes a third token"}


def attribute(be, lone_gen, prompt: list[int], hf: list[int], native: list[int], d: dict, max_new: int,
              hf_batch: int, static: bool) -> dict:
    """Re-generate one row alone on both engines (batch 1, no padding, same max_new) and name the side whose
    batched answer went wrong at divergence d."""
    t0 = time.perf_counter()
    k, common = d["position"], hf[:d["position"]]
    a, b = token_at(hf, k), token_at(native, k)
    runs = {"hf": hf_generate(be.model, [prompt], max_new, be.eos, be.pad, 1, static)[0],
            "native": lone_gen.generate([prompt], max_new)[0][0]}
    out, said = {}, []
    for name, ans in runs.items():
        r = {"equals": "hf_batched" if ans == hf else "native_batched" if ans == native else "neither",
             "at_divergence": lone_choice(ans, common, a, b), "tokens": len(ans),
             "first_diff_vs_hf_batched": first_diff(ans, hf), "first_diff_vs_native_batched": first_diff(ans, native)}
        if r["at_divergence"] == "earlier":  # left the shared prefix first: at a tie, that is bf16 noise
            e = divergence(be, d["row"], prompt, common, ans)
            r.update(left_common_at=e["position"], left_common_at_tie=e["tie"])
            said.append(f"lone {name} left the common prefix at {e['position']} ({'tie' if e['tie'] else 'no tie'})")
        else:
            said.append(f"lone {name} {CHOICE[r['at_divergence']]}"
                        + (f" (equals the {r['equals'].replace('_', '-')} answer)" if r["equals"] != "neither" else ""))
        out[name] = r
    side, basis = verdict(out["hf"]["at_divergence"], out["native"]["at_divergence"], d["ref_argmax_by"])
    why = {"lone runs": (f"HF batch-{hf_batch} (left-padded) diverged" if side == "hf" else
                         "native continuous batch diverged"),
           "reference forward": f"the lone runs do not decide; the reference argmax is {d['ref_argmax_by']}'s",
           None: f"undecided; the reference argmax is {d['ref_argmax_by']}'s"}[basis]
    line = f"{side} side: {why}: " + "; ".join(said) if side != "undecided" else f"{why}: " + "; ".join(said)
    return {"side": side, "basis": basis, "verdict": line, **out, "seconds": round(time.perf_counter() - t0, 2)}


def zero_stats(gen) -> None:
    """Counters back to zero after a warm-up, so the timed run reports only itself."""
    gen.stats.update({k: 0 if isinstance(x, int) else 0.0 for k, x in gen.stats.items()})


def run_native(gen, prompts: list[list[int]], max_new: int, on_finish=lambda *a: None, log=True) -> float:
    """Every prompt through `gen` (continuous batching); returns the wall seconds."""
    todo, t1, n = iter(range(len(prompts))), time.perf_counter(), [0]

    def done(i, toks, reason):
        on_finish(i, toks, reason)
        n[0] += 1
        if log and n[0] % max(1, len(prompts) // 10) == 0:
            el = time.perf_counter() - t1
            print(f"  {n[0]}/{len(prompts)} rows, {gen.stats['generated'] / el:,.0f} tok/s", flush=True)

    sync = torch.cuda.synchronize if gen.device.type == "cuda" else (lambda: None)
    sync()
    t1 = time.perf_counter()
    gen.run(lambda: (lambda i: None if i is None else (i, prompts[i], max_new))(next(todo, None)), done)
    sync()
    return time.perf_counter() - t1


def profile_native(be, prompts: list[list[int]], max_new: int, batch: int) -> dict:
    """torch.profiler over one batch of prompts (prefills + decode steps): the top GPU kernels, so the next
    person sees where a decode step's milliseconds go."""
    from torch.profiler import ProfilerActivity, profile
    gen = Generator(be.model, batch_size=batch, capacity=be.gen.L, eos=list(be.eos), pad=be.pad,
                    graph=be.gen.mode if be.gen.mode != "eager" else "auto")
    run_native(gen, prompts[:batch], 8, log=False)  # warm-up outside the trace
    zero_stats(gen)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if be.device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        secs = run_native(gen, prompts[:batch], max_new, log=False)
    key = "device_time_total" if be.device.startswith("cuda") else "cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:20]
    table = [{"name": e.key[:90], "calls": e.count, "ms": round(getattr(e, key, 0) / 1e3, 2)} for e in rows]
    print(prof.key_averages().table(sort_by=key, row_limit=20), flush=True)
    return {"batch": batch, "rows": min(batch, len(prompts)), "max_new": max_new, "seconds": round(secs, 3),
            "steps": gen.stats["steps"], "prefills": gen.stats["prefills"],
            "decode_s": round(gen.stats["decode_s"], 3), "prefill_s": round(gen.stats["prefill_s"], 3),
            "top_by_" + key: table}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="/tmp/smol-hf")
    ap.add_argument("--data", default="sharegpt", help="ShareGPT JSON path (or built-in 'sharegpt')")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sweep", nargs="*", default=[], metavar="K=V[,K=V]",
                    help="also time these variants on the same prompts (no HF comparison; equal_to_main: the "
                         "same answers as the main run); keys batch, graph (cudagraph/compile/eager), sdpa "
                         "(default/no-cudnn), attn (sdpa/flex: the decode step's attention), e.g. batch=512 "
                         "graph=compile sdpa=no-cudnn attn=flex batch=512,graph=compile")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one batch (64 new tokens)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=768)
    ap.add_argument("--hf-sample", type=int, default=128)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--attribute", type=int, default=8, metavar="N",
                    help="re-generate up to N rows whose first divergence is not a tie alone (batch 1) on both "
                         "engines, to name the side that went wrong")
    ap.add_argument("--graph", default="auto", choices=["auto", "cudagraph", "compile", "eager"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    be = NativeBackend(a.target, device=a.device, dtype=a.dtype, batch_size=a.batch, max_new_tokens=a.max_new,
                       max_prompt_tokens=a.max_prompt, graph=a.graph)
    t_load = time.perf_counter() - t0
    print(f"loaded + decode step ready ({be.gen.mode}) in {t_load:.1f} s", flush=True)
    convs = first_turns(a.data, a.rows)
    enc = [be.encode(c) for c in convs]
    prompts = [e for e in enc if isinstance(e, list)]
    print(f"{len(prompts)} prompts ({len(convs) - len(prompts)} too long / refused)", flush=True)

    answers: list = [None] * len(prompts)

    def on_finish(i, toks, reason):
        answers[i] = (list(toks), reason)

    secs = run_native(be.gen, prompts, a.max_new, on_finish)
    st = dict(be.gen.stats)
    print(f"native: {st['generated']:,} tokens in {secs:.1f} s = {st['generated'] / secs:,.0f} tok/s", flush=True)

    n = min(a.hf_sample, len(prompts))
    t2 = time.perf_counter()
    ref = hf_generate(be.model, prompts[:n], a.max_new, be.eos, be.pad, a.hf_batch, be.device.startswith("cuda"))
    hf_secs = time.perf_counter() - t2
    hf_tokens = sum(map(len, ref))
    exact, gaps = 0, []
    for row, (p, r, (g, _)) in enumerate(zip(prompts[:n], ref, answers[:n])):
        if r == g:
            exact += 1
        else:
            gaps.append(divergence(be, row, p, r, g))
    ties = sum(g["tie"] for g in gaps)
    unexplained = [g for g in gaps if not g["tie"]]
    t3 = time.perf_counter()
    if unexplained and a.attribute > 0:  # the non-tie rows again, alone on both engines
        lone_gen = Generator(be.model, batch_size=1, capacity=be.gen.L, eos=list(be.eos), pad=be.pad,
                             graph=be.gen.mode)
        for d in unexplained[:a.attribute]:
            i = d["row"]
            try:
                chunk = min(a.hf_batch, n - i // a.hf_batch * a.hf_batch)  # the HF batch row i was answered in
                d["alone"] = attribute(be, lone_gen, prompts[i], ref[i], answers[i][0], d, a.max_new, chunk,
                                       be.device.startswith("cuda"))
            except Exception as e:  # noqa: BLE001 - one failed lone run must not cost the benchmark's results
                d["alone"] = {"side": "undecided", "basis": None, "verdict": f"error: {type(e).__name__}: {e}"[:300]}
            print(f"row {i} at {d['position']} (signed gap {d['signed_gap']:+.3f}): {d['alone']['verdict']}",
                  flush=True)
        del lone_gen
    sides = [d.get("alone", {}).get("side", "undecided") for d in unexplained]
    print(f"{len(gaps)} differing, {ties} at a tie; not a tie: {sides.count('hf')} hf side, "
          f"{sides.count('native')} native side, {sides.count('undecided')} undecided", flush=True)
    result = {
        "bench": "regen", "target": a.target, "device": be.device, "dtype": str(be.gen.dtype), "graph": be.gen.mode,
        "rows": len(prompts), "batch": a.batch, "max_new_tokens": a.max_new, "load_and_capture_s": round(t_load, 1),
        "native": {"generated_tokens": st["generated"], "prompt_tokens": st["prompt_tokens"], "seconds": round(secs, 2),
                   "tok_per_s": round(st["generated"] / secs, 1), "steps": st["steps"], "prefills": st["prefills"],
                   # where the time went: decode steps / prefills (each up to its sync) / host scheduling
                   **{k: round(st[k], 2) for k in ("decode_s", "prefill_s", "host_s")},
                   "ms_per_step": round(1000 * st["decode_s"] / max(st["steps"], 1), 2),
                   "finish": {r: sum(x[1] == r for x in answers) for r in ("stop", "length")}},
        "hf_generate": {"rows": n, "batch": a.hf_batch, "generated_tokens": hf_tokens, "seconds": round(hf_secs, 2),
                        "tok_per_s": round(hf_tokens / hf_secs, 1)},
        "match": {"rows": n, "exact": exact, "rate": round(exact / max(n, 1), 4), "differing": n - exact,
                  "differing_at_tie": int(ties),
                  # non-tie divergences: whose batched answer went wrong (rows past --attribute: undecided)
                  "unexplained": len(unexplained), "unexplained_examined": min(len(unexplained), max(a.attribute, 0)),
                  "unexplained_hf_side": sides.count("hf"), "unexplained_native_side": sides.count("native"),
                  "unexplained_undecided": sides.count("undecided"),
                  "unexplained_by_reference": sum(d.get("alone", {}).get("basis") == "reference forward"
                                                  for d in unexplained),
                  "attribution_s": round(time.perf_counter() - t3, 1),
                  # every divergence not explained by a tie, then the first ties
                  "divergences": [g for g in gaps if not g["tie"]] + [g for g in gaps if g["tie"]][:32]},
        "speedup_vs_hf": round((st["generated"] / secs) / max(hf_tokens / hf_secs, 1e-9), 1),
    }
    # the same prompts through a fresh generator on the same model: other batch sizes, decode step modes, kernels
    for item in a.sweep:
        v = {"batch": a.batch, "graph": a.graph, "sdpa": "default", "attn": "sdpa",
             **dict(kv.split("=", 1) for kv in item.split(","))}
        t_build = time.perf_counter()
        gen = Generator(be.model, batch_size=int(v["batch"]), capacity=be.gen.L, eos=list(be.eos), pad=be.pad,
                        graph=v["graph"], decode_sdpa=v["sdpa"], decode_attention=v["attn"])
        run_native(gen, prompts[:int(v["batch"])], 4, log=False)  # compile (graph=compile) before the timing
        t_build = time.perf_counter() - t_build
        zero_stats(gen)
        got: list = [None] * len(prompts)
        s2 = run_native(gen, prompts, a.max_new, lambda i, toks, reason: got.__setitem__(i, (list(toks), reason)),
                        log=False)
        g2 = gen.stats
        differing = sum(x != y for x, y in zip(got, answers))
        result.setdefault("sweep", []).append(
            {**v, "mode": gen.mode, "build_and_warm_s": round(t_build, 1), "tok_per_s": round(g2["generated"] / s2, 1),
             "seconds": round(s2, 2), "equal_to_main": differing == 0, "rows_differing_from_main": differing,
             "ms_per_step": round(1000 * g2["decode_s"] / max(g2["steps"], 1), 2),
             **{k: round(g2[k], 2) for k in ("decode_s", "prefill_s", "host_s")}, "prefills": g2["prefills"]})
        print(f"sweep: {result['sweep'][-1]}", flush=True)
        del gen
    if a.profile:
        result["profile"] = profile_native(be, prompts, 64, a.batch)
    emit(result, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

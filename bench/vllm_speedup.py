"""Served speedup with an eyas EAGLE-3 export, in vLLM or SGLang: greedy tokens/s with and without the draft at
several batch sizes.

    PYTHONPATH=src python bench/vllm_speedup.py --target /tmp/smol-hf --export /tmp/export-k{k} --python /tmp/vpy \
        --chains 1 2 3 4 5 --batch-sizes 1 8 32 --per-category 2 --max-new-tokens 256 --gpus 0 1 --out speedup.json
    PYTHONPATH=src python bench/vllm_speedup.py --engine sglang --target /tmp/smol-hf --export /tmp/export-sglang \
        --python /tmp/spy --chains 3 --trees total=60,depth=7,topk=10 --batch-sizes 1 8 --out speedup-sglang.json

Prompts: the first turn of `--per-category` Spec-Bench questions per category, through the target's chat template.
Each engine runs in its own environment (`--python`); see eyas.engines.speedup. vLLM takes K from the export, so
each chain length is its own export (`--export` with `{k}`); SGLang serves every chain and tree (`--trees`) from one
export. `--engines-per-gpu N` starts up to N engines side by side on each GPU (each with 0.85/N of its memory; vLLM
also with an explicit KV cache sized for the largest batch, so its start-up profiling cannot see a neighbour's
memory as its own; they still time one at a time).
`--out` is rewritten after every engine with what is done so far ("complete": false; a failed engine under
"failed"), so a sweep cut short still leaves its results; the last write says "complete": true.
Exit status 1 when any engine failed.
"""
import argparse
import json
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from eyas.decode.bench import load_bench
from eyas.decode.tree import TreeSpec
from eyas.engines.adapters import ADAPTERS
from eyas.engines.speedup import job_name, measure, report


def write_json(path: Path, doc: dict) -> None:
    """Replace `path` whole (write then rename): a sweep killed mid-write still leaves the previous version."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=sorted(ADAPTERS), default="vllm")
    ap.add_argument("--target", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--python", default=None)
    ap.add_argument("--bench", default="spec-bench")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--chains", type=int, nargs="*", default=[1, 2, 3, 4, 5])
    ap.add_argument("--trees", nargs="*", default=[], help="sglang: EAGLE-2 trees, e.g. total=60,depth=7,topk=10")
    ap.add_argument("--attention-backend", default=None, help="sglang: its attention backend (default triton; fa3 "
                    "and flashinfer need sglang-kernel's FA3 library / FlashInfer's kernels)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gpus", nargs="+", default=["0"])
    ap.add_argument("--engines-per-gpu", type=int, default=1,
                    help="engines started side by side per GPU, each with 0.85/N of its memory and an explicit "
                         "KV cache from the target's config (default 1)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="timed rounds per engine, taken in turns with the wave's other engines; the fastest is "
                         "reported (six engines on one H200 put the plain target 26 %% below its lone speed once)")
    ap.add_argument("--start-after", default=None,
                    help="a file: the engines start at once but time nothing before it exists (untimed work on the "
                         "same GPU, e.g. a Spec-Bench eval, finishes first)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(a.target)
    prompts = []
    for q in load_bench(a.bench, None, a.per_category):
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True,
                                      tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    engine = ADAPTERS[a.engine](a.python)
    specs = [TreeSpec.chain(k) for k in a.chains] + [TreeSpec.parse(t) for t in a.trees]
    out, done, t0 = Path(a.out), {}, time.perf_counter()
    meta = dict(prompts=len(prompts), max_new_tokens=a.max_new_tokens, engines_per_gpu=a.engines_per_gpu,
                rounds=a.rounds)

    def on_result(name: str, doc: dict) -> None:
        done[name] = doc
        write_json(out, {**report(engine, done, {job_name(s): s for s in specs}), **meta,
                         "sweep_s": time.perf_counter() - t0, "complete": False})

    res = measure(engine, a.target, a.export, prompts, specs, a.batch_sizes, a.max_new_tokens, a.gpus,
                  out.with_suffix(".logs"),
                  engines_per_gpu=a.engines_per_gpu, on_result=on_result, rounds=a.rounds, start_after=a.start_after,
                  engine_options={"attention_backend": a.attention_backend} if a.attention_backend else None)
    write_json(out, {**res, **meta, "complete": True})
    for r in res["rows"]:
        vs = (f" vs {r['base_tok_s']:8.1f} = {r['speedup']:.2f}x  same {r['identical_to_base']}"
              if "speedup" in r else " (no base)")
        print(f"{r['spec']} batch={r['batch_size']:>3}: {r['tok_s']:8.1f} tok/s{vs}  tau {r['tau'] or 0:.2f}")
    for name, err in res["failed"].items():
        print(f"{name} FAILED: {(err.strip().splitlines() or [''])[-1]}")  # the traceback's last line
    print("best:", json.dumps(res["best_by_batch"]), f"sweep {res['sweep_s']:.0f}s")
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""vLLM's measured speeds (decode/vllm_reference.json), the yardstick users serve with.

A row holds vLLM's plain autoregressive tokens/s for one model architecture on one GPU at one batch size and
dtype, and, per chain length K, its tokens/s and τ with an eyas draft. The key is the architecture
(`arch_key`: model type and shapes), not the weights: decoding speed depends on the shapes alone, so a
fine-tune of a measured model finds its base model's row. From a row:
  - `eyas eval` reports its own tokens/s over vLLM's AR (beside the speedup over its own AR baseline);
  - the demo says what vLLM would give with this draft: a chain-K step of vLLM costs
    c_K = τ_ref x AR tok/s / spec tok/s plain steps (measured), so a draft of chain-K τ gets ≈ τ / c_K.
"""

from __future__ import annotations

import json
from pathlib import Path

from eyas.target.layers import text_config

TABLE = Path(__file__).with_name("vllm_reference.json")


def arch_key(config) -> str:
    """'qwen2:L28:H1536:I8960:A12:KV2:V151936:untied': what a decode step's cost depends on."""
    c = text_config(config)
    heads = int(c.num_attention_heads)
    tied = bool(getattr(c, "tie_word_embeddings", False))
    return (f"{c.model_type}:L{c.num_hidden_layers}:H{c.hidden_size}:I{getattr(c, 'intermediate_size', 0)}:"
            f"A{heads}:KV{getattr(c, 'num_key_value_heads', None) or heads}:V{c.vocab_size}:"
            f"{'tied' if tied else 'untied'}")


def read_table(path: str | Path | None = None) -> list[dict]:
    """The rows of the table; a malformed file is an error naming it."""
    p = Path(path) if path is not None else TABLE
    try:
        data = json.loads(p.read_text())
        rows = data["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{p}: not a vLLM reference table ({e})") from e
    for i, r in enumerate(rows):
        missing = [k for k in ("arch", "gpu", "dtype", "batch", "ar_tokens_per_s") if k not in r]
        if missing:
            raise ValueError(f"{p}: row {i} lacks {', '.join(missing)}")
    return rows


def lookup(config, gpu: str | None, dtype: str, batch: int = 1, table: str | Path | None = None) -> dict | None:
    """The last row measured for this architecture, GPU name, dtype ('bfloat16', ...) and batch, or None."""
    if not gpu:
        return None
    key = arch_key(config)
    dtype = str(dtype).replace("torch.", "")
    found = [r for r in read_table(table) if r["arch"] == key and r["gpu"] == gpu and r["dtype"] == dtype
             and int(r["batch"]) == int(batch)]
    return found[-1] if found else None


def versus(tokens_per_s: float, row: dict | None) -> float | None:
    """eyas's tokens/s over vLLM's AR tokens/s of the same row (None without a row)."""
    return tokens_per_s / row["ar_tokens_per_s"] if row and row.get("ar_tokens_per_s") else None


def expected_in_vllm(row: dict | None, chain: int, tau: float) -> dict | None:
    """What vLLM would give with a draft of chain-`chain` τ `tau`, from the row's measured step cost at that K."""
    spec = (row or {}).get("spec", {}).get(str(chain))
    if not spec or not spec.get("tokens_per_s"):
        return None
    step_cost = spec["tau"] * row["ar_tokens_per_s"] / spec["tokens_per_s"]   # in plain AR steps
    return {"chain": chain, "tau": tau, "step_cost": round(step_cost, 3), "speedup": round(tau / step_cost, 3),
            "tokens_per_s": round(tau / step_cost * row["ar_tokens_per_s"], 1), "vllm_ar_tokens_per_s":
            row["ar_tokens_per_s"], "gpu": row["gpu"], "batch": row["batch"], "vllm": row.get("vllm")}


def expectation_line(e: dict | None, model: str) -> str:
    """One sentence for reports: the expected vLLM speedup, or why there is none."""
    if e is None:
        return (f"no vLLM figures for {model} on this GPU in eyas's table (decode/vllm_reference.json): measure them "
                "with bench/vllm_speedup.py and add them with bench/vllm_reference.py")
    return (f"≈ {e['speedup']:.2f}× over vLLM {e.get('vllm') or ''} AR ({e['vllm_ar_tokens_per_s']:.0f} tok/s) at "
            f"batch {e['batch']} on {e['gpu']}: chain-{e['chain']} τ {e['tau']:.2f} over vLLM's measured step cost "
            f"of {e['step_cost']:.2f} AR steps at K = {e['chain']}")


def reference_line(row: dict | None, gpu: str | None) -> str:
    """What the eval's 'vs vLLM AR' column is measured against, or that there is no figure to compare with."""
    if row is None:
        return (f"vLLM AR: no measured figure for this model on {gpu or 'this device'} at batch 1 "
                "(decode/vllm_reference.json); speedups are over eyas's own AR baseline only")
    return (f"vLLM AR: {row['ar_tokens_per_s']:.1f} tok/s ({row['model']}, {row['gpu']}, batch {row['batch']}, "
            f"{row['dtype']}, vLLM {row.get('vllm')}, {row.get('prompts')} prompts x {row.get('max_new_tokens')} "
            "new tokens)")


def rows_from_sweep(sweep: dict, *, model: str, arch: str, gpu: str, dtype: str = "bfloat16",
                    source: str = "") -> list[dict]:
    """Table rows (one per batch size) from a bench/vllm_speedup.py result."""
    rows = []
    for batch, ar in sorted(sweep["base_tok_s"].items(), key=lambda kv: int(kv[0])):
        spec = {str(r["chain"]): {"tau": round(r["tau"], 4), "tokens_per_s": round(r["tok_s"], 1)}
                for r in sweep.get("rows", []) if int(r["batch_size"]) == int(batch) and r.get("tok_s")}
        rows.append({"model": model, "arch": arch, "gpu": gpu, "dtype": dtype, "batch": int(batch),
                     "vllm": sweep.get("engine_version") or sweep.get("vllm_version"),   # the latter before 12-04
                     "ar_tokens_per_s": round(ar, 1), "spec": spec,
                     "prompts": sweep.get("prompts"), "max_new_tokens": sweep.get("max_new_tokens"),
                     "source": source})
    return rows


def rows_from_ar_pace(pace: dict, *, model: str, arch: str, dtype: str = "bfloat16", source: str = "") -> list[dict]:
    """The batch-1 AR row of a bench/ar_pace.py result (vLLM's AR beside eyas's, on the GPU it names); none
    when its vLLM half did not run."""
    vllm = pace.get("vllm") or {}
    if not vllm.get("tok_s"):
        return []
    return [{"model": model, "arch": arch, "gpu": pace["hardware"]["gpu"], "dtype": dtype,
             "batch": int(pace.get("batch_size", 1)), "vllm": vllm.get("version"),
             "ar_tokens_per_s": round(vllm["tok_s"], 1), "spec": {}, "prompts": pace.get("prompts"),
             "max_new_tokens": pace.get("max_new_tokens"), "source": source}]


def merge_rows(table: str | Path, new: list[dict]) -> int:
    """Write `new` into the table file, replacing rows of the same architecture, GPU, dtype, batch and vLLM."""
    p = Path(table)
    read_table(p)
    data = json.loads(p.read_text())

    def key(r):
        return (r["arch"], r["gpu"], r["dtype"], int(r["batch"]), r.get("vllm"))

    keys = {key(r) for r in new}
    data["rows"] = [r for r in data["rows"] if key(r) not in keys] + new
    p.write_text(json.dumps(data, indent=1) + "\n")
    return len(data["rows"])

"""An eyas draft or a vLLM / SGLang export against the target, from config.json and safetensors headers (no weight
is loaded): the key contract, finite values, hidden size, vocab and aux ids, and a parallel drafter's hand-overs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from eyas.aux_layers import aux_layer_id_problems
from eyas.doctor.config import Check
from eyas.doctor.target import TargetFacts
from eyas.draft.io import nonfinite_keys, nonfinite_weights, read_draft_config, target_problems
from eyas.export import check_contract, detect_format, read_export
from eyas.export.files import parse_config, read_export_headers


@dataclass
class DraftFacts:
    path: Path
    kind: str                    # "eyas draft" or the export format
    aux_layer_ids: list[int] | None
    target_hidden_size: int | None
    vocab_size: int | None
    draft_vocab_size: int | None
    fc_in: int | None            # fc.weight's input width = k * target hidden
    t2d_len: int | None
    errors: list[str]
    drafter: str = "eagle3"      # the drafter kind (eyas.draft.kinds)
    num_layers: int = 1          # decoder layers the config declares
    weight_layers: int | None = None   # decoder layers the weight file holds (layers.N. / midlayer. keys)
    parallel_tokens: int | None = None
    mask_token_id: int | None = None
    chain: int | None = None     # an export's speculative tokens per step (what vLLM will draft)


def _headers(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from safetensors headers only: a draft's embedding can be GBs; shapes are enough here."""
    shapes: dict[str, list[int]] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shapes[k] = list(h.get_slice(k).get_shape())
    return shapes


def _weight_layers(keys) -> int | None:
    idx = {int(k.split(".")[1]) for k in keys if k.startswith("layers.") and k.split(".")[1].isdigit()}
    return (max(idx) + 1) if idx else (1 if any(k.startswith("midlayer.") for k in keys) else None)


def read_draft(path: Path, out: list[Check]) -> DraftFacts | None:
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        out.append(Check("draft", "fail", f"{path}: no config.json", "pass an eyas draft/run dir or an export dir"))
        return None
    doc = json.loads(cfg_file.read_text())
    chain = None
    if doc.get("format") == "eyas-draft":
        try:  # the owners' checks (aux ids, vocab map), reading no weight but d2t/t2d
            dc, errors = read_draft_config(path), []
        except (KeyError, TypeError, ValueError) as e:
            out.append(Check("draft", "fail", str(e), "re-train or re-import the draft with this eyas"))
            return None
        shapes, kind = _headers(Path(path)), "eyas draft"
        errors = nonfinite_weights(Path(path))
    else:
        try:  # the whole key contract on the safetensors headers (no weight is read); a .bin has no headers
            if any(Path(path).glob("*.safetensors")):
                config, tensors = read_export_headers(path)
                nonfinite = nonfinite_weights(Path(path))        # one tensor in memory at a time
            else:
                config, tensors = read_export(path)
                nonfinite = [f"{k}: holds NaN or inf values" for k in nonfinite_keys(tensors)]
            kind = detect_format(config, tensors)
            dc, errors = parse_config(config, kind, strict=False)
            errors = sorted(set(errors + check_contract(config, tensors))) + nonfinite
        except (OSError, ValueError, KeyError) as e:
            out.append(Check("draft", "fail", f"{path}: {e}", "point --draft at an eyas draft or an export"))
            return None
        shapes = {k: list(t.shape) for k, t in tensors.items()}
        methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
        chain = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
        kind = f"{kind} export"
        if dc is None:
            out.append(Check("draft", "fail", f"{path}: " + "; ".join(errors), "re-export the draft"))
            return None
    fc = shapes.get("fc.weight")
    return DraftFacts(Path(path), kind, list(dc.aux_layer_ids), dc.target_hidden_size, dc.vocab_size,
                      dc.draft_vocab_size, fc[1] if fc and len(fc) == 2 else None,
                      shapes["t2d"][0] if "t2d" in shapes else None, errors, drafter=dc.kind,
                      num_layers=dc.num_layers, weight_layers=_weight_layers(shapes), parallel_tokens=dc.parallel_tokens,
                      mask_token_id=dc.mask_token_id, chain=chain)


def check_parallel(d: DraftFacts, facts: TargetFacts, out: list[Check]) -> None:
    """A parallel drafter's hand-overs: its mask token is a target id, the config's layer count is the weights',
    and the export drafts no more tokens per step than the block it was trained to fill."""
    bad = []
    if d.mask_token_id is None or not 0 <= d.mask_token_id < facts.vocab_size:
        bad.append(f"mask token {d.mask_token_id} is not an id of the target's {facts.vocab_size}-token vocabulary")
    if d.weight_layers is not None and d.weight_layers != d.num_layers:
        bad.append(f"layer count: the config declares {d.num_layers} decoder layers, the weights hold {d.weight_layers}")
    if d.drafter == "dflash" and d.chain is not None and d.parallel_tokens is not None and d.chain > d.parallel_tokens:
        bad.append(f"block size: vLLM would draft {d.chain} tokens per step, the draft fills {d.parallel_tokens} "
                   f"masks per block (block size {d.parallel_tokens + 1})")
    block = f"block {d.parallel_tokens + 1} ({d.parallel_tokens} masks)" if d.drafter == "dflash" else \
        f"{d.parallel_tokens} tokens per forward"
    out.append(Check(f"draft: {d.drafter} hand-over", "fail" if bad else "pass", "; ".join(bad) or
                     f"{block}, mask token {d.mask_token_id}, {d.num_layers} layers (config = weights)"
                     + (f", {d.chain} speculative tokens per step" if d.chain else ""),
                     "re-export with --chain <= the trained tokens, or re-train / re-import the draft" if bad else ""))


def check_draft(d: DraftFacts, ids: list[int], facts: TargetFacts, out: list[Check]) -> None:
    H, V, N = facts.hidden_size, facts.vocab_size, facts.num_layers
    bad = target_problems(vocab_size=d.vocab_size, target_hidden_size=d.target_hidden_size,
                          aux_layer_ids=d.aux_layer_ids, target_vocab=V, target_hidden=H, num_layers=N)
    aux_bad = aux_layer_id_problems(d.aux_layer_ids, N, key="the draft's aux layer ids")
    if d.t2d_len is not None and d.t2d_len != V:
        bad.append(f"vocab mismatch: t2d covers {d.t2d_len} target tokens, the target has {V}")
    if not aux_bad and list(ids) != d.aux_layer_ids:
        bad.append(f"aux layer ids differ: planned {list(ids)}, the draft was trained on {d.aux_layer_ids}")
    if not aux_layer_id_problems(list(ids)):
        bad += aux_layer_id_problems(list(ids), fc_in=d.fc_in, hidden_size=H, key="planned aux layer ids")
    bad += [e if "NaN" in e else f"contract: {e}" for e in d.errors]
    out.append(Check(f"draft vs target", "fail" if bad else "pass", "; ".join(bad) or
                     f"{d.kind} at {d.path}: hidden {H}, vocab {V} (draft vocab {d.draft_vocab_size}), "
                     f"aux {d.aux_layer_ids}, fc width {d.fc_in}",
                     "train/export the draft for this target, or pass the draft's --aux-layer-ids" if bad else ""))

"""`eyas doctor`: check every hand-over of the pipeline in seconds, before a single weight loads.

The target is built on the meta device from its config alone (a 1T-parameter MoE inside a multimodal wrapper
costs ~2 s), so layer paths, aux ids, sizes, the chat template's loss mask, the dataset, an existing draft or
export, the store's disk and GPU budgets and the engine's API are all checked against the same numbers the
real run will use. Each check is pass / warn / fail / skip; every fail says how to fix it; exit 1 on any fail.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from safetensors import safe_open

from eyas.aux_layers import aux_layer_id_problems, choose_aux_layer_ids, default_aux_layer_ids
from eyas.config import StageConfig
from eyas.data import MaskError, PreparedDataset, iter_conversations, render_with_mask
from eyas.data.dataset import MANIFEST as PREPARED_MANIFEST
from eyas.data.masks import template_hash
from eyas.devices import StoreDtype, dtype_bytes
from eyas.draft.io import nonfinite_keys, nonfinite_weights, read_draft_config, target_problems
from eyas.draft.kinds import build_draft, draft_config
from eyas.export import check_contract, detect_format, read_export
from eyas.export.files import parse_config, read_export_headers
from eyas.flags import (DRAFT_VOCAB_SIZE, AuxLayerIds, CacheDir, DraftKind, DraftVocabSize, JsonSwitch, Target,
                        TrustRemoteCode)
from eyas.outputs import input_id, recorded_input, same_input
from eyas.store import HiddenStateStore, bytes_per_token, config_hash, verify_store
from eyas.store.extract import data_fingerprint
from eyas.store.format import MANIFEST as STORE_MANIFEST, identity_mismatches
from eyas.target import LayoutError, build_meta, find_layout, load_config, load_tokenizer
from eyas.target.fastload import weight_file_problems
from eyas.target.inspect import architecture_name, block_kinds
from eyas.target.load import load_special_ids
from eyas.vocab import check_draft_vocab


@dataclass
class Check:
    name: str
    status: str          # pass | warn | fail | skip
    detail: str
    fix: str = ""


class DoctorConfig(StageConfig):
    target: Target
    data: str | None = Field(None, description="conversations (file or built-in name) or a PREPARED dir")
    draft: Path | None = Field(None, description="an eyas draft/run dir or a vLLM/SGLang export to check "
                                                  "against the target")
    engine: Literal["none", "vllm", "sglang"] = Field("none", description="probe this engine's version and entry "
                                                                          "points")
    python: str | None = Field(None, description="the engine env's python (default $EYAS_VLLM_PYTHON, or "
                                                 "$EYAS_SGLANG_PYTHON for sglang)")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="planned aux layer ids (default: the draft's, "
                                                                "else 2, N//2, N-3)")
    layers_path: str | None = Field(None, description="where you expect the decoder layers (e.g. model.layers)")
    chat_template: Path | None = Field(None, description="Jinja chat template file overriding the tokenizer's")
    mask_rows: int = Field(16, description="conversations of --data rendered to validate the loss mask")
    store: Path | None = Field(None, description="an existing STORE to verify, or where the planned store goes")
    store_dtype: StoreDtype = Field("bf16", description="planned store dtype")
    max_samples: int | None = Field(None, ge=1, description="planned number of samples (rows) to extract")
    tokens: int | None = Field(None, description="planned number of tokens to extract (overrides --max-samples)")
    max_length: int = Field(2048, description="planned tokens per row (for the disk and memory estimates)")
    draft_vocab_size: DraftVocabSize = DRAFT_VOCAB_SIZE         # planned, when no data / draft gives it
    token_budget: int = Field(16384, gt=0, description="planned tokens per extraction batch (extract's --token-budget)")
    ttt_steps: int = Field(7, description="planned training-time-test steps (parallel kinds: tokens per forward)")
    draft_kind: DraftKind = Field("eagle3", description="planned drafter (default: the --draft's own kind, else eagle3)")
    gpu_memory_gib: float | None = Field(None, description="GPU memory per device to plan for (default: the "
                                                           "visible GPUs, if any)")
    gpus: int = Field(1, description="GPUs the target is spread over for extraction / online training")
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False
    json: JsonSwitch = False


@dataclass
class TargetFacts:
    """What every check needs to know about the target, from its config alone."""
    config: Any
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_parameters: int
    dtype_bytes: float
    paths: dict[str, str]


def _dtype_bytes(config) -> float:
    """Bytes per weight as served: an fp8 checkpoint (e.g. DeepSeek-V3 / Kimi-K2) stays fp8 on the GPU; a
    compressed-tensors int4 one (Kimi-K2.5's experts) half a byte (its few unquantized layers ignored); a dtype
    the table does not know (auto, a quantized int type) is planned as 2 bytes."""
    t = getattr(config, "text_config", None) or config
    q = getattr(config, "quantization_config", None) or getattr(t, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    if "fp8" in str(q.get("quant_method", "")) or "float8" in str(q.get("fmt", "")) or q.get("fmt") == "e4m3":
        return dtype_bytes("fp8")
    bits = [g.get("weights", {}).get("num_bits") for g in (q.get("config_groups") or {}).values()
            if isinstance(g, dict)] if q.get("quant_method") == "compressed-tensors" else []
    if bits and all(isinstance(b, int) for b in bits):
        return max(bits) / 8
    d = getattr(t, "dtype", None) or getattr(t, "torch_dtype", None) or getattr(config, "dtype", None) or "bf16"
    try:
        return dtype_bytes(d)
    except ValueError:
        return dtype_bytes("bf16")


def check_target(cfg: DoctorConfig, out: list[Check]) -> TargetFacts | None:
    try:
        config = load_config(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any loader failure is this check's finding
        out.append(Check("target config", "fail", f"{cfg.target}: {type(e).__name__}: {e}",
                         "pass a HF model dir with config.json, a hub id, a .gguf or a built-in name"))
        return None
    try:
        model = build_meta(config)
    except Exception as e:  # noqa: BLE001
        out.append(Check("target architecture", "fail", f"cannot build {getattr(config, 'architectures', None)} "
                         f"from its config: {type(e).__name__}: {e}",
                         "upgrade transformers, or pass --trust-remote-code for custom architectures"))
        return None
    try:
        layout = find_layout(model)
    except LayoutError as e:
        out.append(Check("decoder layers", "fail", str(e), "eyas finds the decoder by structure; a model whose "
                         "text decoder is not a ModuleList next to the token embedding is not supported yet"))
        return None
    n, H, V = layout.num_layers, layout.hidden_size, layout.vocab_size
    out.append(Check("decoder layers", "pass", f"{layout.paths['layers']} ({n} x {type(layout.layers[0]).__name__}"
                     f" in {architecture_name(model)}); norm {layout.paths['norm']}, lm_head {layout.paths['lm_head']}"))
    kinds = block_kinds(config)
    out.append(Check("decoder blocks", "pass", f"attention {kinds['attention']}; mlp {kinds['mlp']}"))
    if cfg.layers_path:
        try:
            found = model.get_submodule(cfg.layers_path)
        except AttributeError:
            found = None
        if found is not layout.layers:
            what = "does not exist" if found is None else f"is a {type(found).__name__}, not the decoder layers"
            out.append(Check("layer path", "fail", f"--layers-path {cfg.layers_path} {what} in "
                             f"{architecture_name(model)}; the decoder layers are at {layout.paths['layers']}",
                             f"use {layout.paths['layers']} (a wrapper moves the text model one level down)"))
        else:
            out.append(Check("layer path", "pass", f"{cfg.layers_path} is the decoder"))
    t = getattr(config, "text_config", None) or config
    problems = []
    if getattr(t, "hidden_size", H) != H:
        problems.append(f"config hidden_size {t.hidden_size} != embedding width {H}")
    if getattr(t, "vocab_size", V) != V:
        problems.append(f"config vocab_size {t.vocab_size} != lm_head rows {V}")
    params = sum(p.numel() for p in model.parameters())
    check_weight_files(cfg.target, out)
    out.append(Check("hidden size / vocab", "fail" if problems else "pass",
                     "; ".join(problems) or f"hidden {H}, vocab {V}, {params / 1e9:,.2f}B parameters",
                     "fix the target's config.json" if problems else ""))
    return TargetFacts(config, n, H, V, params, _dtype_bytes(config), layout.paths)


def check_weight_files(spec: str, out: list[Check]) -> None:
    """A local target's weight files are whole (the config alone cannot tell; loading would fail hours later)."""
    d = Path(str(spec)).expanduser()
    if not d.is_dir() or not list(d.glob("*.safetensors")):
        return
    problems = weight_file_problems(d)
    out.append(Check("target weights", "fail" if problems else "pass", "; ".join(problems[:3]) or
                     f"{len(list(d.glob('*.safetensors')))} safetensors file(s) whole (sizes match their headers)",
                     "copy the target's weights again" if problems else ""))


def check_aux(cfg: DoctorConfig, facts: TargetFacts, draft_aux: list[int] | None, out: list[Check]) -> list[int]:
    ids, source = choose_aux_layer_ids(cfg.aux_layer_ids, facts.num_layers, recorded=draft_aux,
                                       recorded_where="the draft")
    problems = aux_layer_id_problems(ids, facts.num_layers, key=source)
    if problems:
        out.append(Check("aux layer ids", "fail", "; ".join(problems),
                         f"pick ids in 0..{facts.num_layers - 1}, e.g. "
                         f"{default_aux_layer_ids(facts.num_layers)}"))
        return ids
    out.append(Check("aux layer ids", "pass", f"{ids} from {source}, valid for {facts.num_layers} layers"))
    return ids


# ---------------------------------------------------------------- draft / export
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


# ---------------------------------------------------------------- template, data
PROBE_CHAT = [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "What is two plus two?"},
              {"role": "assistant", "content": "Two plus two is four."},
              {"role": "user", "content": "And three plus three?"},
              {"role": "assistant", "content": "Three plus three is six."}]


def check_template(cfg: DoctorConfig, facts: TargetFacts, out: list[Check]):
    try:
        tok = load_tokenizer(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # noqa: BLE001
        out.append(Check("tokenizer", "fail", f"{cfg.target}: {type(e).__name__}: {e}",
                         "add the tokenizer files to the target dir"))
        return None
    if len(tok) > facts.vocab_size:
        out.append(Check("tokenizer", "fail", f"tokenizer has {len(tok)} tokens, the target's vocab {facts.vocab_size}",
                         "use the target's own tokenizer"))
    if cfg.chat_template:
        tok.chat_template = Path(cfg.chat_template).read_text()
    src = f"--chat-template {cfg.chat_template}" if cfg.chat_template else "the tokenizer's chat template"
    try:
        ids, mask = render_with_mask(tok, PROBE_CHAT)
    except MaskError as e:
        out.append(Check("chat template / loss mask", "fail", f"{src}: {e}",
                         "use a template that renders every assistant turn verbatim (or pass --chat-template)"))
        return tok
    n = int(mask.sum())
    out.append(Check("chat template / loss mask", "pass" if n else "fail",
                     f"{src}: {n}/{len(ids)} tokens of a 2-turn chat are assistant targets" if n else
                     f"{src}: the loss mask is empty (no assistant tokens)",
                     "" if n else "use a template that renders the assistant turns"))
    check_stops(cfg, tok, ids, mask, out)
    return tok


def check_stops(cfg: DoctorConfig, tok, ids, mask, out: list[Check]) -> None:
    """The ids every stage stops on (eyas.target.special) against the template's assistant end-of-turn tokens
    (each masked run's last token) and the tokenizer's own eos (what chat templates and engines call eos)."""
    try:
        stop = load_special_ids(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code).stop
    except ValueError as e:
        out.append(Check("stop tokens", "fail", str(e), "fix generation_config.json"))
        return
    m = mask.tolist()
    ends = sorted({int(ids[i]) for i in range(len(m)) if m[i] and (i + 1 == len(m) or not m[i + 1])})
    name = lambda i: f"{i} {tok.convert_ids_to_tokens(int(i))!r}"  # noqa: E731
    problems = [f"the template ends assistant turns with {name(i)}, which is no stop id" for i in ends
                if i not in stop]
    if tok.eos_token_id is not None and tok.eos_token_id not in stop:
        problems.append(f"the tokenizer's eos is {name(tok.eos_token_id)}, not a stop id (templates using "
                        "eos_token render it)")
    what = (f"stops on {', '.join(name(i) for i in stop)} (config / generation_config.json)" if stop else
            "no eos_token_id in the config or generation_config.json: only the length stops generation")
    out.append(Check("stop tokens", "warn" if problems or not stop else "pass", "; ".join([what] + problems),
                     "set eos_token_id in generation_config.json (or re-convert a GGUF target with this eyas)"
                     if problems or not stop else ""))


def check_data(cfg: DoctorConfig, facts: TargetFacts, tok, out: list[Check]) -> dict | None:
    path = Path(str(cfg.data)).expanduser()
    if (path / PREPARED_MANIFEST).is_file():
        return check_prepared(path, facts, tok, out)
    try:
        records = list(iter_conversations(cfg.data, limit=cfg.mask_rows * 4, cache=cfg.cache_dir))
    except (OSError, ValueError) as e:
        out.append(Check("dataset schema", "fail", f"{cfg.data}: {e}", "pass a conversations file, a built-in "
                         "dataset name or a PREPARED dir"))
        return None
    ok = [r for r in records if r.ok]
    rejects = Counter(r.category for r in records if not r.ok)
    out.append(Check("dataset schema", "fail" if not ok else "warn" if len(ok) < len(records) / 2 else "pass",
                     f"{len(ok)}/{len(records)} sampled rows usable"
                     + (f"; rejects {dict(rejects)}" if rejects else ""),
                     "rows need [{role, content}] messages (or ShareGPT from/value) with assistant turns"))
    if tok is None or not ok:
        return None
    fails, n_ok = Counter(), 0
    for r in ok[:cfg.mask_rows]:
        if r.messages is None:
            continue  # plain-text rows have no template to validate
        try:
            n_ok += bool(render_with_mask(tok, r.messages)[1].any())
        except MaskError as e:
            fails[str(e).split(":", 1)[0]] += 1
    total = n_ok + sum(fails.values())
    status = "pass" if not fails else "fail" if n_ok == 0 else "warn"
    out.append(Check("loss mask on data", status, f"{n_ok}/{total} rendered rows have a valid assistant mask"
                     + (f"; failures {dict(fails)}" if fails else ""), "check the chat template against these rows"))
    return None


def check_prepared(path: Path, facts: TargetFacts, tok, out: list[Check]) -> dict | None:
    try:
        ds = PreparedDataset(path, verify=True)  # a flipped byte in a rows shard must fail here, not train
        m = ds.manifest
        d2t, t2d = ds.vocab()
        freq = ds.freq()
    except (OSError, ValueError, KeyError) as e:
        out.append(Check("dataset schema", "fail", f"{path}: {e}", "re-run `eyas prepare`"))
        return None
    bad = []
    if m["target"].get("vocab_size") not in (None, facts.vocab_size):
        bad.append(f"prepared for vocab {m['target']['vocab_size']}, target has {facts.vocab_size}")
    want = m["target"].get("chat_template_sha256")
    if want and tok is not None and getattr(tok, "chat_template", None) and template_hash(tok) != want:
        bad.append("prepared with a different chat template than the target's tokenizer has")
    out.append(Check("dataset schema", "fail" if bad else "pass", "; ".join(bad) or
                     f"PREPARED {path.name}: {len(ds)} rows, max_length {m['max_length']}",
                     "re-run `eyas prepare` with this target" if bad else ""))
    problems = check_draft_vocab(d2t, t2d, vocab_size=facts.vocab_size)
    total = int(freq.sum())
    coverage = float(freq[t2d].sum()) / total if total and freq.numel() == t2d.numel() else 0.0
    status = "fail" if problems else "warn" if coverage < 0.9 else "pass"
    out.append(Check("draft vocab coverage", status, "; ".join(problems) or
                     f"{d2t.numel()} draft tokens cover {coverage:.1%} of assistant tokens",
                     "re-run `eyas prepare`" if problems else "raise --draft-vocab-size in `eyas prepare`"))
    return {"draft_vocab_size": int(d2t.numel()), "tokens": int(m["summary"].get("tokens") or 0) or None,
            "fingerprint": data_fingerprint(ds)}


# ---------------------------------------------------------------- store, disk, memory
def planned_tokens(cfg: DoctorConfig, prepared: dict | None) -> int | None:
    if cfg.tokens:
        return cfg.tokens
    if cfg.max_samples:
        return cfg.max_samples * cfg.max_length
    return (prepared or {}).get("tokens")


def check_store(cfg: DoctorConfig, facts: TargetFacts, ids: list[int], prepared: dict | None,
                out: list[Check]) -> None:
    if cfg.store is not None and (Path(cfg.store) / STORE_MANIFEST).is_file():
        problems = verify_store(cfg.store)
        if not problems:
            m = HiddenStateStore(cfg.store).manifest
            tgt = m.get("target", {})
            have, want_data = m.get("data", {}).get("manifest_sha256"), (prepared or {}).get("fingerprint", {})
            if have and want_data and have != want_data.get("manifest_sha256"):
                out.append(Check("store vs data", "warn", f"{cfg.store} was extracted from other PREPARED data "
                                 f"than {cfg.data}", "re-run `eyas extract` if the data changed"))
            want = {"hidden_size": facts.hidden_size, "num_layers": facts.num_layers,
                    "vocab_size": facts.vocab_size, "aux_layer_ids": list(ids),
                    "config_hash": config_hash(facts.config)}
            problems = identity_mismatches(tgt, {k: v for k, v in want.items() if k in tgt})
            have, now = recorded_input(cfg.store, "target"), input_id(cfg.target, cache=cfg.cache_dir)
            if have is not None and not same_input(have, now):
                problems.append(f"the store was extracted from target {have.get('spec')} (content "
                                f"{str(have.get('sha256'))[:12]}), --target {cfg.target} has content "
                                f"{str(now.get('sha256'))[:12]}: other weights give other hidden states")
        out.append(Check("store", "fail" if problems else "pass", "; ".join(problems[:5]) +
                         (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "") or
                         f"{cfg.store}: every shard verified (sha256, shapes, finite values)",
                         "re-run `eyas extract` into this dir (it redoes only the bad shards)" if problems else ""))
        return
    tokens = planned_tokens(cfg, prepared)
    if not tokens:
        out.append(Check("disk for store", "skip", "no --tokens / --max-samples / PREPARED dir to size the store"))
        return
    bpt = bytes_per_token(facts.hidden_size, len(ids), cfg.store_dtype)
    need = bpt * tokens
    where = Path(cfg.store or ".").expanduser().resolve()
    while not where.exists():
        where = where.parent
    if cfg.store is not None and not os.access(where, os.W_OK | os.X_OK):
        out.append(Check("store location", "fail", f"--store {cfg.store}: {where} is not writable by this user",
                         "choose a --store under a directory you can write"))
    free = shutil.disk_usage(where).free
    gib = 1 << 30
    status = "fail" if need > free else "warn" if need > 0.8 * free else "pass"
    out.append(Check("disk for store", status, f"{tokens:,} tokens x {bpt:,} B/token ({cfg.store_dtype}, "
                     f"{len(ids)} aux + last) = {need / gib:,.1f} GiB; {free / gib:,.1f} GiB free at {where}",
                     "free disk, use --store-dtype fp8 (about half), extract fewer samples, or train online"))


def draft_parameters(facts: TargetFacts, ids: list[int], vd: int, kind: str = "eagle3") -> tuple[int, int]:
    """(trainable, frozen) parameters of the draft this target gets, counted on the meta device."""
    parallel = kind != "eagle3"
    with torch.device("meta"):
        d = build_draft(draft_config(facts.config, kind, aux_layer_ids=ids, draft_vocab_size=vd,
                                     parallel_tokens=1 if parallel else None,   # counts do not depend on it
                                     mask_token_id=facts.vocab_size - 1 if parallel else None))
    frozen = sum(p.numel() for p in d.parameters() if not p.requires_grad)   # the kind's recipe decides
    return sum(p.numel() for p in d.parameters()) - frozen, frozen


def check_memory(cfg: DoctorConfig, facts: TargetFacts, ids: list[int], vd: int, out: list[Check],
                 kind: str = "eagle3") -> None:
    gib, H, k, T = 1 << 30, facts.hidden_size, len(ids), cfg.max_length
    t = getattr(facts.config, "text_config", None) or facts.config
    inter = max(int(getattr(t, "intermediate_size", 4 * H) or 4 * H), 4 * H)
    weights = facts.num_parameters * facts.dtype_bytes / max(cfg.gpus, 1)
    # Extraction: weights + captured states (k+1 bf16 vectors/token) + the widest transient (MLP) per batch.
    extract = weights + cfg.token_budget * (k + 1) * H * 2 + cfg.token_budget * (inter + 4 * H) * 2 * 2
    trainable, frozen = draft_parameters(facts, ids, vd, kind)
    # Training: fp32 master + grad + 2 Adam moments (16 B) per trainable, bf16 frozen embedding, and per TTT step
    # the draft-vocab logits in fp32 (value + softmax + grad) and the layer activations of one row.
    train = trainable * 16 + frozen * 2 + cfg.ttt_steps * T * (vd * 4 * 3 + 24 * H * 2) + T * k * H * 2
    avail = cfg.gpu_memory_gib * gib if cfg.gpu_memory_gib else None
    if avail is None:
        try:
            if torch.cuda.is_available():
                avail = float(torch.cuda.get_device_properties(0).total_memory)
        except Exception:  # noqa: BLE001 - no usable CUDA means nothing to compare against
            avail = None
    for name, need, fix in (("GPU memory: extraction", extract, "spread the target over more GPUs (--gpus), use a "
                             "smaller --token-budget, or a quantized target"),
                            ("GPU memory: training (offline)", train, "shorten --max-length or the draft vocabulary"),
                            ("GPU memory: training (online)", train + weights, "train offline from a store, or "
                             "spread the target over more GPUs")):
        detail = f"~{need / gib:,.1f} GiB per GPU (estimate)"
        if avail is None:
            out.append(Check(name, "pass", detail + "; no GPU visible here (pass --gpu-memory-gib to compare)"))
        else:
            status = "fail" if need > avail else "warn" if need > 0.9 * avail else "pass"
            out.append(Check(name, status, detail + f" of {avail / gib:,.0f} GiB", fix))


# ---------------------------------------------------------------- engine
def check_engine(cfg: DoctorConfig, facts: TargetFacts | None = None, drafter: str = "eagle3") -> list[Check]:
    """The engine's version and every entry point eyas calls, plus those of the target's architecture (a Kimi-K2.5
    target: the wrapper class, its text model, the registries that read its config) and of the drafter kind (P-EAGLE,
    DFlash: the speculators updater, the draft class)."""
    from eyas.engines.adapters import ADAPTERS
    from eyas.engines.base import EngineError

    t0, out, kind = time.perf_counter(), [], ADAPTERS[cfg.engine]
    archs = list(getattr(facts.config, "architectures", None) or []) if facts is not None else []
    try:
        engine = kind(cfg.python, architectures=archs, drafters=(drafter,))
        results = engine.probe()  # one worker run: the version comes with it
        version = engine.version()
    except EngineError as e:
        out.append(Check(f"engine: {kind.name}", "fail", str(e).split("\n")[0], kind.how_to_create.replace("\n", " ")))
        return out
    status, detail = engine.version_status(version)
    out.append(Check(f"engine: {kind.name} version", status, f"{detail} at {engine.python}",
                     f"install a tested version: {', '.join(kind.tested_versions)}"))
    bad = [r for r in results if not r.ok]
    for r in bad:
        out.append(Check(f"engine: {r.entry_point}", "fail", r.detail,
                         f"{kind.label} {version} changed an API eyas calls: install {kind.label} "
                         f"{kind.tested_versions[-1]}, or update the caller and {kind.__module__}.ENTRY_POINTS"))
    for problem in engine.drafter_problems(version):
        out.append(Check(f"engine: drafter {drafter}", "fail", problem,
                         f"install {kind.label} {kind.tested_versions[-1]}"))
    out.append(Check("engine: entry points", "fail" if bad else "pass",
                     f"{len(results) - len(bad)}/{len(results)} {kind.label} entry points bind with eyas's arguments "
                     f"(probed in {time.perf_counter() - t0:.1f}s, no model loaded)"))
    for arch in (a for a in archs if a in kind.served_layers):
        own = [r for r in results if any(arch in ep.architectures for ep in engine.entry_points
                                         if ep.name == r.entry_point)]
        ok = all(r.ok for r in own)
        out.append(Check("engine: target", "pass" if ok else "fail",
                         f"{kind.label} {version} serves {arch} with its decoder layers at {kind.served_layers[arch]}"
                         f" (eyas captures {facts.paths['layers']}) and EAGLE-3 aux states through the wrapper's "
                         f"set_aux_hidden_state_layers" if ok else
                         f"{kind.label} {version} lacks what serving {arch} needs: "
                         + "; ".join(r.entry_point for r in own if not r.ok),
                         "" if ok else f"use {kind.label} {', '.join(kind.tested_versions)}"))
    return out


def check_engine_aux(facts: TargetFacts, ids: list[int], out: list[Check]) -> None:
    """Aux ids the engine's model cannot capture, though they are valid ids (vLLM's DeepSeek-V2/V3 decoder)."""
    from eyas.engines.vllm import aux_layer_id_problems_in_vllm

    problems = aux_layer_id_problems_in_vllm(facts.config, ids)
    if problems:
        out.append(Check("engine: aux layer ids", "fail", "; ".join(problems),
                         f"pick ids from 1, e.g. {default_aux_layer_ids(facts.num_layers)}"))


def diagnose(cfg: DoctorConfig) -> list[Check]:
    out: list[Check] = []
    engine = None
    facts = check_target(cfg, out)
    draft = None
    if facts is not None:
        draft = read_draft(cfg.draft, out) if cfg.draft else None
        ids = check_aux(cfg, facts, draft.aux_layer_ids if draft else None, out)
        if draft is not None:
            check_draft(draft, ids, facts, out)
            if draft.drafter != "eagle3":
                check_parallel(draft, facts, out)
        if cfg.engine == "vllm":
            check_engine_aux(facts, ids, out)
    if cfg.engine != "none":
        # The probe waits on another process (importing vLLM takes tens of seconds): it runs beside the checks below,
        # and not at all when the target, aux ids or draft already failed, so those fail in seconds.
        if any(c.status == "fail" for c in out):
            out.append(Check(f"engine: {cfg.engine}", "skip", "not probed: fix the failures above first"))
        else:
            pool = ThreadPoolExecutor(max_workers=1)
            engine = pool.submit(check_engine, cfg, facts, draft.drafter if draft else cfg.draft_kind)
            pool.shutdown(wait=False)
    if facts is not None:
        tokenizer = check_template(cfg, facts, out)
        prepared = check_data(cfg, facts, tokenizer, out) if cfg.data else None
        check_store(cfg, facts, ids, prepared, out)
        vd = (draft.draft_vocab_size if draft else None) or (prepared or {}).get("draft_vocab_size") \
            or min(cfg.draft_vocab_size, facts.vocab_size)
        check_memory(cfg, facts, ids, vd, out, draft.drafter if draft else cfg.draft_kind)
    if engine is not None:
        out += engine.result()
    return out


def render_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    mark = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    lines = []
    for c in checks:
        lines.append(f"{mark[c.status]}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("fail", "warn"):
            lines.append(f"{'':4}  {'':<{width}}  fix: {c.fix}")
    n = {s: sum(c.status == s for c in checks) for s in mark}
    lines.append(f"{n['pass']} passed, {n['warn']} warnings, {n['fail']} failed, {n['skip']} skipped")
    return "\n".join(lines)


def run(cfg: DoctorConfig):
    t0 = time.perf_counter()
    checks = diagnose(cfg)
    seconds = round(time.perf_counter() - t0, 2)
    failed = [c.name for c in checks if c.status == "fail"]
    if cfg.json:
        print(json.dumps({"ok": not failed, "failed": failed, "seconds": seconds,
                                        "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(render_table(checks) + f" in {seconds:.1f}s")
    return 1 if failed else 0

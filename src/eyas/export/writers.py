"""`export_vllm` / `export_sglang`: an eyas draft dir -> a directory the engine serves as-is.

Order matters: build the config and the renamed tensors in memory, run the contract check, and only
then write (into OUT.tmp, renamed into place), so a refused export leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eyas import __version__
from eyas.draft.io import load_draft
from eyas.devices import resolve_dtype
from eyas.draft.kinds import get_kind
from eyas.draft.model import DraftConfig
from eyas.export.contract import MIDLAYER, SPECULATORS, rename
from eyas.export.files import ContractError, check_contract
from eyas.export.formats import to_midlayer
from eyas.outputs import claim
from eyas.target.load import resolve

def target_spec(meta: dict[str, Any]) -> str | None:
    """The target a draft was trained for, from its meta (a string, or a dict naming it)."""
    t = meta.get("target")
    if isinstance(t, str):
        return t
    if isinstance(t, dict):
        for k in ("path", "spec", "name"):
            if isinstance(t.get(k), str):
                return t[k]
    return None


def resolve_verifier(meta: dict[str, Any], dc: DraftConfig, verifier: str | None) -> tuple[str, list[str]]:
    """(name_or_path, architectures) for speculators_config.verifier. Local and built-in targets become an
    absolute path so `LLM(model=EXPORT)` finds them; hub ids stay hub ids; --verifier overrides."""
    archs = list(dc.extra.get("target_architectures") or [])
    train = meta.get("train") if isinstance(meta.get("train"), dict) else {}
    candidates = [c for c in (verifier, target_spec(meta), train.get("target")) if isinstance(c, str) and c]
    if not candidates:
        raise ValueError("the draft's config.json names no target (meta key 'target'); pass --verifier NAME_OR_PATH "
                         "(the model vLLM should serve as the verifier)")
    name, errors = None, []
    for spec in candidates:
        try:
            src = resolve(spec)
        except FileNotFoundError as e:
            errors.append(str(e))
            continue
        name = str(Path(src.path).resolve()) if Path(src.path).is_dir() else src.path
        break
    if name is None:
        if not verifier:
            raise FileNotFoundError("cannot resolve the draft's target for the export's verifier: " + "; ".join(errors))
        name = verifier  # an explicit --verifier the user vouches for (e.g. a hub id used on another machine)
    if not archs and Path(name).is_dir() and (Path(name) / "config.json").is_file():
        archs = list(json.loads((Path(name) / "config.json").read_text()).get("architectures") or [])
    return name, archs


def target_embedding(verifier: str) -> torch.Tensor | None:
    """Only the target's token-embedding tensor, read lazily from its safetensors (no model load)."""
    root = Path(verifier)
    if not root.is_dir():
        return None
    files = sorted(root.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key.endswith("embed_tokens.weight") or key.endswith("wte.weight") or key.endswith("embeddings.weight"):
                    return st.get_tensor(key)
    return None


def decide_embed(sd: dict[str, torch.Tensor], verifier: str, mode: str) -> tuple[bool, str]:
    """Include embed_tokens in the export? vLLM and SGLang share the target's embedding when the draft
    has none; eyas drafts hold a frozen copy, so omitting it is exact whenever the copy is bit-identical."""
    if mode == "include":
        return True, "included (--embed include)"
    if mode == "omit":
        return False, "omitted (--embed omit): the engine shares the target's embedding"
    tgt = target_embedding(verifier)
    mine = sd["embed_tokens.weight"]
    if tgt is None:
        return True, "included: the target's embedding could not be read to prove the draft's copy identical"
    if tgt.shape == mine.shape and torch.equal(tgt.to(mine.dtype), mine) and torch.equal(mine.to(tgt.dtype), tgt):
        return False, "omitted: bit-identical to the target's embedding, which the engine shares"
    return True, "included: differs from the target's embedding"


def _tau_lines(meta: dict[str, Any]) -> list[str]:
    """Every measured τ the run recorded (metrics.*tau*), verbatim; nothing is invented."""
    out: list[str] = []

    def walk(d: Any, path: str):
        if isinstance(d, dict):
            for k, v in d.items():
                walk(v, f"{path}.{k}" if path else k)
        elif "tau" in path.split(".")[-1].lower() and isinstance(d, (int, float)):
            out.append(f"- `{path}`: {d:.3f}")

    walk(meta.get("metrics") or {}, "")
    return out


def model_card(fmt: str, meta: dict[str, Any], dc: DraftConfig, verifier: str, chain: int, embed_note: str,
               source: Path) -> str:
    train = meta.get("train")
    train = train if isinstance(train, dict) else {}
    data = meta.get("data") or train.get("data") or train.get("store")
    taus = _tau_lines(meta)
    serve = (f"```bash\nvllm serve {{THIS_DIR}}          # zero flags: the verifier and K={chain} come from config.json\n"
             f"eyas serve-check --draft {{THIS_DIR}} --engine vllm   # served τ vs eyas's native τ\n```"
             if fmt == SPECULATORS else
             "```bash\npython -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 \\\n"
             f"  --speculative-draft-model-path {{THIS_DIR}} --speculative-num-steps {chain} "
             "--speculative-eagle-topk 1 --speculative-num-draft-tokens " + str(chain + 1) + "\n```")
    return "\n".join([
        f"# {get_kind(dc).title} draft for `{target_spec(meta) or verifier}`", "",
        f"Trained and exported by eyas {__version__} ({'speculators / vLLM' if fmt == SPECULATORS else 'SGLang LlamaForCausalLMEagle3'} format).", "",
        "| | |", "|---|---|",
        f"| target (verifier) | `{verifier}` |",
        f"| training data | {json.dumps(data) if data else 'not recorded in the draft'} |",
        f"| aux layer ids (residual entering layer k) | {dc.aux_layer_ids} |",
        f"| hidden / target hidden | {dc.hidden_size} / {dc.target_hidden_size} |",
        f"| vocab / draft vocab | {dc.vocab_size} / {dc.draft_vocab_size} |",
        f"| norm_before_residual | {dc.norm_before_residual} |",
        f"| embed_tokens | {embed_note} |",
        f"| source draft | `{source}` |", "",
        "## Measured acceptance (τ = tokens per verification step, incl. the bonus token)", "",
        *(taus or ["- no τ was recorded in the run's metrics; measure it with `eyas eval` / `eyas serve-check`"]), "",
        "## Serve", "", serve, ""])


def _write_dir(out: Path, config: dict, tensors: dict[str, torch.Tensor], card: str) -> Path:
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "README.md").write_text(card)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _prepare(draft_dir, dtype: str, verifier: str | None, embed: str):
    cast = None if dtype == "auto" else resolve_dtype(dtype, "cpu")  # auto keeps the draft's own dtype
    model, meta = load_draft(draft_dir)
    dc = model.config
    state = get_kind(dc).to_export(dc, model.state_dict())     # the kind's export tensors, eyas names
    sd = {k: (v.to(cast) if cast is not None and v.is_floating_point() else v).detach().cpu()
          for k, v in state.items()}
    ver, archs = resolve_verifier(meta, dc, verifier)
    keep_embed, note = decide_embed(sd, ver, embed)
    if not keep_embed:
        sd.pop("embed_tokens.weight")
    if dc.draft_vocab_size == dc.vocab_size:
        # Full vocab: the map must be the identity, and engines expect no map at all.
        d2t, t2d = sd.pop("d2t"), sd.pop("t2d")
        if bool(d2t.any()) or not bool(t2d.all()):
            raise ContractError(f"refusing to export {draft_dir}", [
                "d2t/t2d: draft_vocab_size == vocab_size but the map is not the identity"])
    fdtype = str(next(v.dtype for v in sd.values() if v.is_floating_point())).replace("torch.", "")
    return model, meta, dc, sd, ver, archs, note, fdtype


def _check_and_write(fmt: str, config: dict, sd: dict[str, torch.Tensor], draft_dir, out, meta, dc: DraftConfig,
                     verifier: str, chain: int, note: str, overwrite: bool = False) -> Path:
    """Provenance (engines ignore the extra key; serve-check and import read it), rename, check, write into
    `out` as claimed by eyas.outputs (an earlier export is replaced; the draft, or anything else, is not)."""
    src = Path(draft_dir).resolve()
    config["eyas"] = {"eyas_version": __version__, "source_draft": str(src), "target": target_spec(meta),
                      "embed_tokens": note}
    tensors = {rename(k, fmt): v for k, v in sd.items()}
    errors = check_contract(config, tensors)
    if errors:
        raise ContractError(f"refusing to write {out}", errors)
    with claim(out, "export", overwrite=overwrite, inputs={"draft": draft_dir}) as held:
        _write_dir(held.path, config, tensors, model_card(fmt, meta, dc, verifier, chain, note, src))
    return Path(out)


def export_vllm(draft_dir: str | os.PathLike, out: str | os.PathLike, *, chain: int | None = None,
                verifier: str | None = None, embed: str = "auto", dtype: str = "auto", overwrite: bool = False) -> Path:
    """Speculators-format dir that `vllm serve OUT` (or `LLM(model=OUT)`) serves with no other flag.
    chain: speculative tokens per step (default: the kind's, 3 for EAGLE-3)."""
    if chain is not None and chain < 1:
        raise ValueError(f"chain (speculative tokens) must be >= 1, got {chain}")
    _, meta, dc, sd, ver, archs, note, fdtype = _prepare(draft_dir, dtype, verifier, embed)
    kind = get_kind(dc)
    chain = kind.default_chain(dc) if chain is None else chain
    config = kind.to_speculators(dc, chain=chain, verifier=ver, verifier_arch=archs, dtype=fdtype)
    return _check_and_write(SPECULATORS, config, sd, draft_dir, out, meta, dc, ver, chain, note, overwrite)


def export_sglang(draft_dir: str | os.PathLike, out: str | os.PathLike, *, chain: int | None = None,
                  verifier: str | None = None, embed: str = "auto", dtype: str = "auto", overwrite: bool = False
                  ) -> Path:
    """SGLang `LlamaForCausalLMEagle3` dir (keys midlayer.*, eagle_config aux ids in SGLang's convention)."""
    _, meta, dc, sd, ver, archs, note, fdtype = _prepare(draft_dir, dtype, verifier, embed)
    chain = 3 if chain is None else chain
    kind = get_kind(dc)
    if not kind.export_sglang:
        raise ContractError(f"refusing to write {out}", [
            f"kind: {kind.name}; eyas writes SGLang's LlamaForCausalLMEagle3 layout for EAGLE-3 drafts only "
            f"(export --format vllm serves {kind.title})"])
    problems = []
    if dc.norm_before_residual:
        problems.append("norm_before_residual: true, but SGLang's Eagle3 midlayer keeps the residual before "
                        "hidden_norm (norm_before_residual=false); serving this draft there would silently change "
                        "its math. Train with norm_before_residual=false for SGLang, or export --format vllm")
    if dc.norm_before_fc:
        problems.append("norm_before_fc: true has no SGLang equivalent (its fc has no input norm)")
    if dc.num_aux != 3:
        problems.append(f"aux_layer_ids: {dc.aux_layer_ids}; SGLang's fc takes exactly 3 aux states")
    if min(dc.aux_layer_ids) < 1:
        problems.append(f"aux_layer_ids: {dc.aux_layer_ids}; id 0 (the embedding output) has no SGLang spelling "
                        f"(its ids name a layer's output)")
    if problems:
        raise ContractError(f"refusing to write {out}", problems)
    config = to_midlayer(dc, dtype=fdtype)
    return _check_and_write(MIDLAYER, config, sd, draft_dir, out, meta, dc, ver, chain, note, overwrite)

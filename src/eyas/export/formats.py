"""Config mapping tables: eyas DraftConfig <-> speculators (vLLM) config <-> midlayer (SGLang/research) config.

Readers return (DraftConfig | None, errors) where every error names the config key. `strict=True` is the
export-side contract (keys eyas always writes explicitly must be present); `strict=False` is the
import side, which applies the same defaults the engine itself would apply for an absent key.
"""

from __future__ import annotations

from typing import Any

from eyas.aux_layers import aux_layer_id_problems
from eyas.draft.model import DraftConfig

# Aux-id conventions. eyas / vLLM: id k = the residual stream entering decoder layer k.
# SGLang / SpecForge `eagle_config.eagle_aux_hidden_state_layer_ids`: id j = the OUTPUT of layer j, which
# SGLang captures as the input of layer j+1 (its set_eagle3_layers_to_capture adds 1). So sglang = eyas - 1.
SGLANG_AUX_OFFSET = 1


def rope_fields(dc: DraftConfig) -> dict[str, Any]:
    """Both spellings: transformers >= 5 reads rope_parameters; 4.x (older engines) reads rope_theta/rope_scaling."""
    scaling = dict(dc.rope_scaling) if dc.rope_scaling else None
    params = {"rope_type": (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")),
              "rope_theta": dc.rope_theta, **{k: v for k, v in (scaling or {}).items() if k not in ("type",)}}
    return {"rope_theta": dc.rope_theta, "rope_scaling": scaling, "rope_parameters": params}


def llama_fields(dc: DraftConfig) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_size": dc.hidden_size, "intermediate_size": dc.intermediate_size,
        "num_attention_heads": dc.num_attention_heads, "num_key_value_heads": dc.num_key_value_heads,
        "head_dim": dc.head_dim, "num_hidden_layers": dc.num_layers, "vocab_size": dc.vocab_size,
        "rms_norm_eps": dc.rms_norm_eps, "max_position_embeddings": dc.max_position_embeddings,
        "attention_bias": dc.attention_bias, "mlp_bias": dc.mlp_bias, "hidden_act": dc.hidden_act,
        # The draft's lm_head is its own (draft vocab); tying it to embed_tokens would be wrong.
        "tie_word_embeddings": False, **rope_fields(dc),
    }


def speculators_header(model_type: str, architecture: str, *, chain: int, verifier: str,
                       verifier_arch: list[str]) -> dict[str, Any]:
    """The keys every speculators config opens with: what vLLM turns into its speculative config."""
    return {
        "architectures": [architecture],
        "speculators_model_type": model_type,
        "speculators_version": "0.1.0",
        "speculators_config": {
            "algorithm": model_type,
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(chain),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_arch)},
        },
    }


def to_speculators(dc: DraftConfig, *, chain: int, verifier: str, verifier_arch: list[str],
                   dtype: str) -> dict[str, Any]:
    """The config.json vLLM serves with `LLM(model=EXPORT)` alone (vllm/transformers_utils/configs/speculators)."""
    return {
        **speculators_header("eagle3", "Eagle3Speculator", chain=chain, verifier=verifier,
                             verifier_arch=verifier_arch),
        "transformer_layer_config": {**llama_fields(dc), "dtype": dtype},
        "draft_vocab_size": dc.draft_vocab_size,
        "target_hidden_size": dc.target_hidden_size,
        # Always explicit: vLLM defaults an absent norm_before_residual to True and absent aux ids to its own.
        "norm_before_residual": dc.norm_before_residual,
        "norm_before_fc": dc.norm_before_fc,
        "eagle_aux_hidden_state_layer_ids": list(dc.aux_layer_ids),
        "torch_dtype": dtype,
    }


def to_midlayer(dc: DraftConfig, *, dtype: str) -> dict[str, Any]:
    """SGLang's LlamaForCausalLMEagle3 config (python/sglang/srt/models/llama_eagle3.py + model_runner)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], **llama_fields(dc),
        "draft_vocab_size": dc.draft_vocab_size, "target_hidden_size": dc.target_hidden_size,
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": [i - SGLANG_AUX_OFFSET for i in dc.aux_layer_ids]},
        "torch_dtype": dtype,
    }


class Reader:
    """Pulls typed fields out of a config dict, recording one error per bad key instead of raising."""

    def __init__(self, doc: dict[str, Any], where: str):
        self.doc, self.where, self.errors = doc, where, []

    def get(self, key: str, typ, default: Any = ...):
        """`default=...` means the key is required."""
        if key not in self.doc or self.doc[key] is None:
            if default is ...:
                self.errors.append(f"{self.where}{key}: missing")
                return None
            return default
        v = self.doc[key]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            self.errors.append(f"{self.where}{key}: expected {getattr(typ, '__name__', typ)}, got {v!r}")
            return None
        return v


def rope_from(doc: dict[str, Any]) -> tuple[float, dict | None]:
    params = doc.get("rope_parameters") if isinstance(doc.get("rope_parameters"), dict) else {}
    theta = params.get("rope_theta", doc.get("rope_theta", 10000.0))
    scaling = doc.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"} or None
    if not isinstance(scaling, dict) or scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    ok = isinstance(theta, (int, float)) and not isinstance(theta, bool)
    return float(theta) if ok else float("nan"), scaling   # nan: reported as not a positive finite base


def llama_to_dc(r: Reader, *, vd, target_hidden, aux, nbr, nbfc, model_types=("llama",)) -> DraftConfig | None:
    H = r.get("hidden_size", int)
    nh = r.get("num_attention_heads", int)
    fields = dict(
        hidden_size=H, intermediate_size=r.get("intermediate_size", int), num_attention_heads=nh,
        num_key_value_heads=r.get("num_key_value_heads", int, default=nh),
        head_dim=r.get("head_dim", int, default=(H // nh if H and nh else None)),
        vocab_size=r.get("vocab_size", int), rms_norm_eps=r.get("rms_norm_eps", float, default=1e-6),
        max_position_embeddings=r.get("max_position_embeddings", int, default=4096),
        attention_bias=r.get("attention_bias", bool, default=False), mlp_bias=r.get("mlp_bias", bool, default=False),
        hidden_act=r.get("hidden_act", str, default="silu"))
    layers = r.get("num_hidden_layers", int, default=1)   # how many the kind allows: its own check
    if r.doc.get("model_type", model_types[0]) not in model_types:
        r.errors.append(f"{r.where}model_type: {r.doc.get('model_type')!r}; eyas reads {list(model_types)} layers here")
    theta, scaling = rope_from(r.doc)
    r.errors += _impossible(r.where, fields, vd, target_hidden, theta)
    if r.errors or any(v is None for v in (vd, target_hidden, aux, nbr)):
        return None
    return DraftConfig(**fields, draft_vocab_size=vd, target_hidden_size=target_hidden, aux_layer_ids=list(aux),
                       rope_theta=theta, rope_scaling=scaling, norm_before_residual=nbr, norm_before_fc=nbfc,
                       num_layers=layers)


def _impossible(where: str, f: dict[str, Any], vd, target_hidden, theta: float) -> list[str]:
    """Values no draft can have: a zero width, a non-positive epsilon or RoPE base, heads that do not group."""
    errs = []
    sizes = {k: f[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                               "head_dim", "vocab_size", "max_position_embeddings")}
    sizes.update(draft_vocab_size=vd, target_hidden_size=target_hidden)
    errs += [f"{where}{k}: {v}; must be a positive size" for k, v in sizes.items() if isinstance(v, int) and v <= 0]
    eps = f.get("rms_norm_eps")
    if isinstance(eps, float) and not 0 < eps < 1:
        errs.append(f"{where}rms_norm_eps: {eps}; must be in (0, 1)")
    if not (0 < theta < float("inf")):
        errs.append(f"{where}rope_theta: {theta}; must be a positive finite base")
    nh, nkv = f.get("num_attention_heads"), f.get("num_key_value_heads")
    if isinstance(nh, int) and isinstance(nkv, int) and nh > 0 and nkv > 0 and nh % nkv:
        errs.append(f"{where}num_key_value_heads: {nkv} does not divide num_attention_heads {nh}")
    V = f.get("vocab_size")
    if isinstance(vd, int) and isinstance(V, int) and vd > V > 0:
        errs.append(f"draft_vocab_size: {vd} is larger than the vocabulary ({V})")
    return errs


def speculators_problems(cfg: dict[str, Any], model_type: str, *, strict: bool) -> list[str]:
    """What vLLM's SpeculatorsConfig needs of any speculators config (the kind-independent part)."""
    errs: list[str] = []
    if cfg.get("speculators_model_type") != model_type:
        errs.append(f"speculators_model_type: {cfg.get('speculators_model_type')!r}, expected {model_type!r}")
    sc = cfg.get("speculators_config")
    if not isinstance(sc, dict):
        errs.append("speculators_config: missing or not a mapping")
    else:
        methods = sc.get("proposal_methods")
        if not (isinstance(methods, list) and methods and isinstance(methods[0], dict)
                and isinstance(methods[0].get("speculative_tokens"), int) and methods[0]["speculative_tokens"] >= 1):
            errs.append("speculators_config.proposal_methods[0].speculative_tokens: missing or not a positive int")
        ver = sc.get("verifier")
        if not (isinstance(ver, dict) and isinstance(ver.get("name_or_path"), str) and ver["name_or_path"]):
            errs.append("speculators_config.verifier.name_or_path: missing (vLLM loads the target from it)")
        if strict and sc.get("algorithm") != model_type:
            errs.append(f"speculators_config.algorithm: {sc.get('algorithm')!r}, expected {model_type!r}")
    return errs


def from_speculators(cfg: dict[str, Any], *, strict: bool, default_aux: list[int] | None = None,
                     model_type: str = "eagle3", norm_before_residual: bool = True
                     ) -> tuple[DraftConfig | None, list[str]]:
    """An EAGLE-3-layout speculators config (eagle3, and peagle with its own type and vLLM's default for an
    absent norm_before_residual) -> DraftConfig."""
    top = Reader(cfg, "")
    errs = speculators_problems(cfg, model_type, strict=strict)
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        return None, errs + ["transformer_layer_config: missing or not a mapping"]
    for flag in ("fc_norm", "norm_output"):
        if cfg.get(flag):
            errs.append(f"{flag}: true is an EAGLE-3.1 variant the eyas draft does not implement")
    # Import mirrors vLLM's defaults for absent keys; export requires them explicit.
    need = (lambda k, t, dflt: top.get(k, t)) if strict else (lambda k, t, dflt: top.get(k, t, default=dflt))
    V = tlc.get("vocab_size")
    vd = need("draft_vocab_size", int, V)
    th = need("target_hidden_size", int, tlc.get("hidden_size"))
    nbr = need("norm_before_residual", bool, norm_before_residual)
    nbfc = top.get("norm_before_fc", bool, default=False)
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if aux is None and not strict and default_aux is not None:
        aux = list(default_aux)
    errs += aux_layer_id_problems(aux, key="eagle_aux_hidden_state_layer_ids")
    dc = llama_to_dc(_sub := Reader(tlc, "transformer_layer_config."), vd=vd, target_hidden=th,
                      aux=aux if not errs else None, nbr=nbr, nbfc=nbfc)
    errs = errs + top.errors + _sub.errors
    return (dc if not errs else None), errs


def from_midlayer(cfg: dict[str, Any], *, default_aux: list[int] | None = None) -> tuple[DraftConfig | None, list[str]]:
    """Research EAGLE-3 / SpecForge / SGLang configs. Their layer uses the residual *before* hidden_norm
    (norm_before_residual=False) and their fc always takes 3 aux states."""
    r = Reader(cfg, "")
    errs: list[str] = []
    ec = cfg.get("eagle_config") or {}
    ids = ec.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        errs += aux_layer_id_problems(ids, key="eagle_config.eagle_aux_hidden_state_layer_ids")
        aux = [i + SGLANG_AUX_OFFSET for i in ids] if not errs else None
    elif default_aux is not None:
        aux = list(default_aux)
    else:
        aux = None
        errs.append("eagle_config.eagle_aux_hidden_state_layer_ids: absent, so the checkpoint uses the EAGLE default "
                    "(2, N//2, N-3) of its target; pass the target so eyas can compute it")
    if aux is not None and len(aux) != 3:
        errs.append(f"eagle_config.eagle_aux_hidden_state_layer_ids: {len(aux)} ids; this format's fc takes exactly 3")
    if cfg.get("tie_word_embeddings"):
        errs.append("tie_word_embeddings: true would make SGLang use embed_tokens as the draft lm_head")
    V = cfg.get("vocab_size")
    vd = r.get("draft_vocab_size", int, default=V)
    th = r.get("target_hidden_size", int, default=cfg.get("hidden_size"))
    dc = llama_to_dc(r, vd=vd, target_hidden=th, aux=aux if not errs else None, nbr=False, nbfc=False)
    errs += r.errors
    return (dc if not errs else None), errs

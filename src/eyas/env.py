"""The environment switches: every `EYAS_*` variable eyas reads, in one table that says what each does.

A few are for users (where the cache, the engine environments and the benchmark questions are; threads; log
cadence; tracebacks), the rest for diagnosing the decoder and trainer, and for the fault-injection tests. A
setting a command's run depends on is a config flag instead (its `--help` names the switch where one sets its
default). Code reads a switch through `get(NAME)` only; tests/test_env.py fails on an `EYAS_` name under
src/ that is not in SWITCHES, and on an entry nothing reads. Pure Python: `eyas --help` and threads.py use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    default: str | None   # the value when unset (None: unset means "not given")
    kind: str             # user | diagnosis | test
    what: str


SWITCHES: dict[str, Switch] = {
    "EYAS_CACHE": Switch(None, "user", "cache for built-in targets, datasets and engine packages "
                                       "(unset: ~/.cache/eyas); --cache-dir wins"),
    "EYAS_NUM_THREADS": Switch(None, "user", "CPU threads for torch (unset: the CPUs this process may use); "
                                             "`eyas --threads N` wins"),
    "EYAS_PROGRESS_INTERVAL": Switch("15", "user", "seconds between progress lines when the output is a log file"),
    "EYAS_SPEC_BENCH": Switch(None, "user", "a Spec-Bench question.jsonl to use instead of the packaged copy"),
    "EYAS_VLLM_PYTHON": Switch(None, "user", "python of the vLLM environment (unset: --python is required)"),
    "EYAS_SGLANG_PYTHON": Switch(None, "user", "python of the SGLang environment (unset: --python is required)"),
    "EYAS_WHEELS": Switch(None, "user", "directories of wheels (separated by the path separator) that built-in "
                                        "targets' packages are taken from instead of the package index"),
    "EYAS_DEBUG": Switch(None, "user", "any value: a failure prints its traceback, not one line"),
    "EYAS_DECODE_INNER": Switch("compiled", "diagnosis", "what the decoder's CUDA graphs capture: compiled "
                                                          "(torch.compile'd steps) or eager"),
    "EYAS_DECODE_GRAPHS": Switch("1", "diagnosis", "0: decode rounds without CUDA graphs"),
    "EYAS_PREFILL_GRAPHS": Switch("1", "diagnosis", "0: prefills run eagerly at the prompt's length instead of "
                                                    "as CUDA graphs of padded chunks"),
    "EYAS_DECODE_MIN_BUCKET": Switch("1024", "diagnosis", "smallest KV bucket of the compiled decoder; "
                                                          "`eyas eval --min-bucket` wins"),
    "EYAS_DRAFT_CACHE": Switch("inplace", "diagnosis", "copy: draft levels concatenate their KV cache instead "
                                                       "of writing it in place"),
    "EYAS_GROUPED_STEPS": Switch("0", "diagnosis", "1: the decoder's target steps attend with the query heads of a "
                                                   "KV group sharing it instead of K/V repeated per head (A/B)"),
    "EYAS_PREFILL_SDPA": Switch("portable", "diagnosis", "any: graphed prefill chunks attend with PyTorch's own "
                                                           "SDPA choice (cuDNN included) instead of flash / "
                                                           "memory-efficient, as eager prefills do (A/B)"),
    "EYAS_PREFILL_INNER": Switch("eager", "diagnosis", "compiled: graphed prefill chunks capture a torch.compile'd "
                                                        "step (fused elementwise kernels) instead of the eager one, "
                                                        "each chunk shape compiled and captured on its first use, "
                                                        "not at warm-up (A/B of the prefill alone)"),
    "EYAS_PROMPT_CATCHUP": Switch("chunks", "diagnosis", "eager: the draft's catch-up over a prompt at its own "
                                                         "length instead of graphed, padded chunks"),
    "EYAS_TTT_MASK": Switch(None, "diagnosis", "reference: build the flex TTT block mask per step (slow)"),
    "EYAS_STORE_PAUSE_AT": Switch(None, "test", "a store crash point's name: the extractor hangs there"),
    "EYAS_STORE_PAUSE_MARK": Switch(None, "test", "a file the extractor writes when it reaches that point"),
    "EYAS_TRAIN_PAUSE_AT": Switch(None, "test", "a checkpoint crash point's name: the trainer hangs there"),
    "EYAS_TRAIN_PAUSE_MARK": Switch(None, "test", "a file the trainer writes when it reaches that point"),
    "EYAS_TRAIN_DISK_FULL_AT": Switch(None, "test", "a checkpoint crash point's name: saving fails there as on "
                                                    "a full disk"),
}


def changed(kind: str = "diagnosis") -> dict[str, str]:
    """The switches of `kind` set to something other than their default: what a measurement records it ran with."""
    return {n: os.environ[n] for n, sw in SWITCHES.items()
            if sw.kind == kind and os.environ.get(n) and os.environ[n] != sw.default}


def get(name: str) -> str | None:
    """$NAME when set and not empty, else the switch's default. A name not in SWITCHES is a bug."""
    if name not in SWITCHES:
        raise KeyError(f"{name}: not an eyas switch; declare it in eyas.env.SWITCHES")
    return os.environ.get(name) or SWITCHES[name].default


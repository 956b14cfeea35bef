"""A stand-in `eyas` command that raises a chosen error: tests/test_cli_errors.py walks every known error
type through `eyas.cli.main` with it."""

from __future__ import annotations

import errno
import pickle

from eyas.config import StageConfig


class RaiseConfig(StageConfig):
    kind: str


def _safetensor_error():
    import tempfile

    from safetensors.torch import load_file
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{trunc")
        f.flush()
        load_file(f.name)


def _oom():
    import torch
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def _make(kind: str) -> BaseException | None:
    from eyas.config import ConfigError
    from eyas.data.dataset import PreparedError
    from eyas.data.masks import MaskError
    from eyas.engines.base import EngineError
    from eyas.export.files import ContractError
    from eyas.store.format import StoreError
    from eyas.train.checkpoint import CheckpointError, Interrupted
    table = {
        "config": ConfigError("run.yaml: key 'lr' must be > 0"),
        "store": StoreError("/s/shard-00001.safetensors: sha256 differs from the manifest"),
        "prepared": PreparedError("/p/manifest.json: missing key 'shards'"),
        "contract": ContractError("/x", ["fc.weight: shape (3, 4) but the contract needs (4, 4)"]),
        "checkpoint": CheckpointError("/r/checkpoints/step-4/state.pt: not a loadable eyas checkpoint"),
        "mask": MaskError("no_template: the tokenizer has no chat template"),
        "engine": EngineError("vllm: no python found; pass --python"),
        "missing": FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/x.json"),
        "exists": FileExistsError(errno.EEXIST, "File exists", "/out/run"),
        "permission": PermissionError(errno.EACCES, "Permission denied", "/root/out"),
        "isdir": IsADirectoryError(errno.EISDIR, "Is a directory", "/data"),
        "disk-full": OSError(errno.ENOSPC, "No space left on device", "/out/shard-00003.safetensors.tmp"),
        "key": KeyError("/v/vocab.safetensors: no tensor 'd2t'"),
        "import": ModuleNotFoundError("No module named 'gguf'", name="gguf"),
        "unicode": UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        "json": __import__("json").JSONDecodeError("Expecting value", "x", 0),
        "recursion": RecursionError("maximum recursion depth exceeded"),
        "unpickling": pickle.UnpicklingError("Weights only load failed"),
        "memory": MemoryError(),
        "cpu-oom": RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate "
                                "memory: you tried to allocate 21474836480 bytes. Error code 12"),
        "safetensors-full": __import__("safetensors").SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
        "multiline": ValueError("first line\n  second line\n  third"),
        "interrupt": Interrupted("interrupted at step 3; continue from step-2 with the same command plus --resume"),
        "ctrl-c": KeyboardInterrupt(),
        "bug": ZeroDivisionError("division by zero"),
    }
    return table.get(kind)


def run(cfg: RaiseConfig):
    if cfg.kind == "safetensors":
        _safetensor_error()
    if cfg.kind == "oom":
        _oom()
    raise _make(cfg.kind)

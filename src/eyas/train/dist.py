"""torchrun plumbing: process group, DDP / FSDP2 wrapping, full (rank-0) state dicts for checkpoints.

Single-process runs use the plain module; everything here degrades to no-ops when WORLD_SIZE is 1.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init(device_kind: str) -> Dist:
    """Join the torchrun process group if there is one (nccl on GPU, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
        # Torn down once, at exit: re-creating the default group in one process (two runs in a row)
        # can meet the first group's stale rendezvous keys in torchrun's store.
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local)
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local)


def wrap(module: nn.Module, d: Dist, how: str, device: torch.device) -> nn.Module:
    if d.world == 1:
        return module
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    if how == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (d.world,))
        # One shard group: the draft is a single decoder layer, so per-layer groups buy nothing.
        fully_shard(module, mesh=mesh)
        return module
    raise ValueError(f"parallel must be 'ddp' or 'fsdp', got {how!r}")


def unwrap(module: nn.Module) -> nn.Module:
    return getattr(module, "module", module)


def _opts(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, **kw)


def full_state(model: nn.Module, opt: torch.optim.Optimizer, d: Dist) -> tuple[dict, dict]:
    """Unsharded model + optimizer state (on rank 0; other ranks may get empty dicts)."""
    if d.world == 1:
        return unwrap(model).state_dict(), opt.state_dict()
    from torch.distributed.checkpoint.state_dict import get_state_dict
    return get_state_dict(model, opt, options=_opts(cpu_offload=True))


def load_full_state(model: nn.Module, opt: torch.optim.Optimizer, d: Dist, msd: dict, osd: dict) -> None:
    if d.world == 1:
        unwrap(model).load_state_dict(msd)
        opt.load_state_dict(osd)
        return
    from torch.distributed.checkpoint.state_dict import set_state_dict
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd, options=_opts())


def shutdown(d: Dist) -> None:
    if d.world > 1 and dist.is_initialized():
        # Every rank is past its last collective before any rank returns (the group lives until exit).
        dist.barrier()

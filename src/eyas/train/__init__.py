"""EAGLE-3 draft training: training-time test over a store (offline) or the live target (online).

Names resolve lazily so that `eyas.train.ttt` (pure torch) imports without the CLI's pydantic/yaml,
e.g. in bench/train.py on a bare GPU stack.
"""

from __future__ import annotations

__all__ = ["TrainConfig", "simulated_tau", "train"]


def __getattr__(name: str):
    if name in ("TrainConfig", "train"):
        from eyas.train import loop
        return getattr(loop, name)
    if name == "simulated_tau":
        from eyas.train.ttt import simulated_tau
        return simulated_tau
    raise AttributeError(f"module 'eyas.train' has no attribute {name!r}")

"""EAGLE-3 draft training: training-time test over a store (offline) or the live target (online)."""

from eyas.train.loop import TrainConfig, train
from eyas.train.ttt import simulated_tau

__all__ = ["TrainConfig", "simulated_tau", "train"]

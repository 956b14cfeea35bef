"""Native speculative decoding: chain + EAGLE-2 tree drafting, one-forward tree verification on a
slot KV cache, greedy / rejection-sampling acceptance, the AR baseline, Spec-Bench eval, cost model."""

from eyas.decode.bench import load_bench
from eyas.decode.evaluate import evaluate
from eyas.decode.session import Session
from eyas.decode.tree import TreeSpec

__all__ = ["Session", "TreeSpec", "evaluate", "load_bench"]

"""eyas: train, evaluate and export EAGLE-3 speculative-decoding drafts for any HF causal LM."""

__version__ = "0.1.0"

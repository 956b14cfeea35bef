"""Data stage: conversation sources, template-agnostic loss masks, packing, draft vocabulary, regeneration."""

from eyas.data.dataset import PreparedDataset, PreparedError, positions_from_lengths
from eyas.data.masks import ChatRenderer, MaskError, render_with_mask
from eyas.data.sources import Record, iter_conversations
from eyas.vocab import build_draft_vocab, check_draft_vocab  # the owner is eyas.vocab; data re-exports its API

__all__ = ["ChatRenderer", "MaskError", "PreparedDataset", "PreparedError", "Record", "build_draft_vocab",
           "check_draft_vocab", "iter_conversations", "positions_from_lengths", "render_with_mask"]

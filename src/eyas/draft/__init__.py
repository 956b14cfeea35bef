"""The EAGLE-3 draft model (pure torch) and its on-disk form."""

from eyas.draft.model import DraftConfig, Eagle3Draft, draft_config_from_target

__all__ = ["DraftConfig", "Eagle3Draft", "draft_config_from_target"]

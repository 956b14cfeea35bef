"""Draft models (pure torch) and their on-disk form; one package per drafter kind, found through
eyas.draft.kinds (the registry keyed by DraftConfig.kind)."""

from eyas.draft.kinds import build_draft, get_kind
from eyas.draft.model import DraftConfig, Eagle3Draft, draft_config_from_target

__all__ = ["DraftConfig", "Eagle3Draft", "build_draft", "draft_config_from_target", "get_kind"]

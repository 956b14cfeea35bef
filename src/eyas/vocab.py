"""The draft vocabulary: the one owner of how it is built, mapped and checked (pure torch).

The draft vocabulary is the most frequent target tokens over loss-masked positions. vLLM and speculators
read `d2t` as int64 offsets (target_id = draft_id + d2t[draft_id]) and `t2d` as a bool mask over the target
vocabulary. The offsets assume draft ids are the selected target ids in ascending order, so selection is
by frequency but numbering is by target id. prepare and train build it here; the draft model, the trainer's
target head, the export contract, doctor and the readers map and check it here.
"""

from __future__ import annotations

import torch


class DraftVocabError(ValueError):
    """A (d2t, t2d) pair an engine would misread; the message names what disagrees."""


def build_draft_vocab(freq: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(d2t int64 [Vd], t2d bool [V], coverage) for the top-`size` tokens of `freq` [V] (size capped at V).

    Ties (including never-seen tokens, which fill the vocabulary when fewer than `size` tokens occur) go to
    the lower target id, so the result is deterministic. coverage = share of counted tokens inside the draft
    vocabulary (0.0 when nothing was counted).
    """
    freq = torch.as_tensor(freq).to(torch.int64).flatten()
    V = freq.numel()
    if V == 0:
        raise DraftVocabError("build_draft_vocab: empty frequency table")
    if size < 1:
        raise DraftVocabError(f"build_draft_vocab: draft vocabulary size must be >= 1, got {size}")
    size = min(int(size), V)
    # stable sort on the negated counts: highest frequency first, lower id first among equals
    order = torch.sort(-freq, stable=True).indices[:size]
    d2t, t2d = vocab_from_target_ids(order, V)
    total = int(freq.sum())
    coverage = float(freq[t2d].sum()) / total if total else 0.0
    return d2t, t2d, coverage


def vocab_from_target_ids(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for a set of distinct target ids (any order): draft ids number them ascending."""
    chosen = torch.sort(torch.as_tensor(ids, dtype=torch.int64).flatten()).values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(chosen.numel(), dtype=torch.int64), t2d


def full_vocab(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The identity map: a draft whose vocabulary is the target's."""
    return torch.zeros(vocab_size, dtype=torch.int64), torch.ones(vocab_size, dtype=torch.bool)


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target id of every draft id [Vd]: draft_id + d2t[draft_id] (the speculators/vLLM convention)."""
    return torch.arange(d2t.numel(), device=d2t.device, dtype=d2t.dtype) + d2t


def check_draft_vocab(d2t: torch.Tensor | None, t2d: torch.Tensor | None, *, vocab_size: int | None = None,
                         draft_vocab_size: int | None = None) -> list[str]:
    """Every problem with a (d2t, t2d) pair as vLLM would read it, one message each (empty = consistent)."""
    if d2t is None or t2d is None:
        return [f"{'d2t' if d2t is None else 't2d'}: missing (a draft vocabulary needs both d2t and t2d)"]
    problems = []
    if d2t.dtype != torch.int64:
        problems.append(f"d2t: dtype is {str(d2t.dtype).replace('torch.', '')}, expected int64")
    if t2d.dtype != torch.bool:
        problems.append(f"t2d: dtype is {str(t2d.dtype).replace('torch.', '')}, expected bool")
    if draft_vocab_size is not None and tuple(d2t.shape) != (draft_vocab_size,):
        problems.append(f"d2t: shape {list(d2t.shape)}, expected [{draft_vocab_size}] (draft_vocab_size)")
    if vocab_size is not None and tuple(t2d.shape) != (vocab_size,):
        problems.append(f"t2d: covers {t2d.numel()} target ids; the target vocabulary has {vocab_size}")
    if problems or d2t.dim() != 1 or t2d.dim() != 1:
        return problems or [f"d2t/t2d: must be 1-D, got {list(d2t.shape)} / {list(t2d.shape)}"]
    tgt = target_ids(d2t.cpu())
    V = t2d.numel()
    if d2t.numel() and (int(tgt.min()) < 0 or int(tgt.max()) >= V):
        return [f"d2t: maps draft ids to target ids outside [0, {V}) (range {int(tgt.min())}..{int(tgt.max())}); "
                f"d2t must hold offsets target_id - draft_id"]
    if d2t.numel() > 1 and not bool((tgt[1:] > tgt[:-1]).all()):
        problems.append("d2t: draft ids are not in ascending target-id order (or two map to the same target id)")
    mark = torch.zeros(V, dtype=torch.bool)
    mark[tgt] = True
    if not torch.equal(mark, t2d.cpu()):
        problems.append(f"t2d: marks {int(t2d.sum())} target ids but d2t maps {d2t.numel()} draft ids (t2d marks "
                        f"exactly draft_id + d2t[draft_id])")
    return problems


def require_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor, *, vocab_size: int | None = None,
                        where: str = "draft vocab") -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) when consistent (and sized for `vocab_size`), else DraftVocabError naming `where`."""
    problems = check_draft_vocab(d2t, t2d, vocab_size=vocab_size)
    if problems:
        raise DraftVocabError(f"{where}: " + "; ".join(problems))
    return d2t, t2d


def unused_token(freq: torch.Tensor | None, vocab_size: int) -> int:
    """The mask token of a parallel drafter (its embedding is learned, so no real token should share it): the
    highest target id the counts `freq` [V] never saw, else (no counts, or every id seen) the last id."""
    if freq is not None:
        unseen = torch.nonzero(torch.as_tensor(freq).flatten()[:vocab_size] == 0).flatten()
        if unseen.numel():
            return int(unseen[-1])
    return int(vocab_size) - 1

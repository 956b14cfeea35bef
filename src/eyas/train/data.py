"""Batches for training: the same rows, order and padding offline (store) and online (target in loop).

Both modes share one index space: store row i is prepared row i (extract walks the PREPARED rows in
order). A `Plan` fixes the held-out split and the per-epoch shuffle from the seed alone, so a global
step number is a complete data position (resume needs nothing else) and every rank can compute its
own slice of each global batch without communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from eyas.target import target_states

ROW_KEYS = ("input_ids", "loss_mask", "position_ids")


@dataclass
class Plan:
    n_rows: int
    batch_size: int            # rows per rank per micro-batch
    world: int = 1
    grad_accum: int = 1
    eval_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self):
        g = torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(self.n_rows, generator=g).tolist()
        n_eval = 0 if self.eval_fraction <= 0 or self.n_rows < 2 else max(1, round(self.eval_fraction * self.n_rows))
        self.eval_rows = sorted(perm[:n_eval])
        self.train_rows = sorted(perm[n_eval:])
        if len(self.train_rows) < self.rows_per_step:
            fixes = ([f"lower --batch-size (now {self.batch_size})"] if self.batch_size > 1 else []) + \
                    ([f"lower --grad-accum (now {self.grad_accum})"] if self.grad_accum > 1 else []) + \
                    ([f"use fewer processes (now {self.world})"] if self.world > 1 else []) + \
                    ([f"lower --eval-fraction (now {self.eval_fraction}, {n_eval} rows held out)"] if n_eval else []) + \
                    ["add data"]
            raise ValueError(f"{len(self.train_rows)} training rows cannot fill one optimizer step of "
                             f"{self.rows_per_step} rows (batch_size {self.batch_size} x world {self.world} x "
                             f"grad_accum {self.grad_accum}); " + ", or ".join(fixes))

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.world * self.grad_accum

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_rows) // self.rows_per_step    # the ragged tail of an epoch is dropped

    def step_rows(self, step: int, rank: int = 0) -> list[list[int]]:
        """Row ids of this rank's micro-batches for optimizer step `step` (0-based)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 1)
        order = [self.train_rows[j] for j in torch.randperm(len(self.train_rows), generator=g).tolist()]
        chunk = order[i * self.rows_per_step:(i + 1) * self.rows_per_step]
        micro = []
        for a in range(self.grad_accum):
            glob = chunk[a * self.batch_size * self.world:(a + 1) * self.batch_size * self.world]
            micro.append(glob[rank * self.batch_size:(rank + 1) * self.batch_size])
        return micro

    def eval_batches(self, rank: int = 0, limit: int | None = None) -> list[list[int]]:
        rows = self.eval_rows[rank::self.world]
        batches = [rows[i:i + self.batch_size] for i in range(0, len(rows), self.batch_size)]
        # Same number of batches on every rank (empty ones padded in): FSDP forwards are collectives.
        most = -(-len(self.eval_rows[0::self.world]) // self.batch_size) if self.eval_rows else 0
        batches += [[] for _ in range(most - len(batches))]
        return batches[:limit] if limit else batches


def check_row(row: dict, where: str) -> None:
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise KeyError(f"{where}: row is missing keys {missing}")
    T = row["input_ids"].shape[0]
    for k in ROW_KEYS[1:]:
        if row[k].shape[0] != T:
            raise ValueError(f"{where}: {k} has length {row[k].shape[0]}, input_ids has {T}")


def collate(rows: list[dict], max_length: int | None = None, keys=ROW_KEYS, pad_to: int | None = None
            ) -> dict[str, torch.Tensor]:
    """Right-pad rows into [B, T] (+ any [T, ...] state tensors). Padding is its own document
    (position ids restart at 0) with loss_mask False, so it is never attended to nor counted.
    pad_to: a fixed T (static shapes keep compiled FlexAttention from recompiling per batch)."""
    cut = [{k: r[k][:max_length] if max_length else r[k] for k in keys} for r in rows]
    T = max(r["input_ids"].shape[0] for r in cut)
    if pad_to:
        T = max(T, pad_to)
    out = {}
    for k in keys:
        parts = []
        for r in cut:
            x, pad = r[k], T - r[k].shape[0]
            if pad:
                if k == "position_ids":
                    fill = torch.arange(pad, dtype=x.dtype)
                else:
                    fill = torch.zeros((pad, *x.shape[1:]), dtype=x.dtype)
                x = torch.cat([x, fill])
            parts.append(x)
        out[k] = torch.stack(parts)
    out["loss_mask"] = out["loss_mask"].bool()
    out["input_ids"] = out["input_ids"].long()
    out["position_ids"] = out["position_ids"].long()
    return out


def checked_rows(source, ids: list[int], what: str, vocab_size: int | None = None) -> list[dict]:
    rows = [source[i] for i in ids]
    for i, row in zip(ids, rows):
        check_row(row, f"{what} row {i}")
        ids_ = row["input_ids"]
        if vocab_size is not None and ids_.numel() and (int(ids_.max()) >= vocab_size or int(ids_.min()) < 0):
            raise ValueError(f"{what} row {i}: token id {int(ids_.max())} outside the target vocabulary (size "
                             f"{vocab_size}); was the data prepared for another tokenizer?")
    return rows


class OfflineSource:
    """Rows from a hidden-state store: {input_ids, loss_mask, position_ids, aux [T,k,H], last [T,H]}."""

    online = False

    def __init__(self, store, max_length: int | None = None, pad_to: int | None = None):
        self.store, self.max_length, self.pad_to = store, max_length, pad_to

    def __len__(self):
        return len(self.store)

    def batch(self, ids: list[int], device) -> dict[str, torch.Tensor]:
        rows = checked_rows(self.store, ids, "store")
        b = collate(rows, self.max_length, ROW_KEYS + ("aux", "last"), self.pad_to)
        return {k: v.to(device, non_blocking=True) for k, v in b.items()}


class OnlineSource:
    """Rows from a PREPARED dataset; the target runs on each batch (no disk) to produce aux/last."""

    online = True

    def __init__(self, dataset, model, layout, aux_ids: list[int], max_length: int | None = None,
                 pad_to: int | None = None):
        self.dataset, self.model, self.layout = dataset, model, layout
        self.aux_ids, self.max_length, self.pad_to = list(aux_ids), max_length, pad_to

    def __len__(self):
        return len(self.dataset)

    def batch(self, ids: list[int], device) -> dict[str, torch.Tensor]:
        rows = checked_rows(self.dataset, ids, "prepared", self.layout.vocab_size)
        b = {k: v.to(device) for k, v in collate(rows, self.max_length, pad_to=self.pad_to).items()}
        aux, last, _ = target_states(self.model, self.layout, b["input_ids"], self.aux_ids,
                                     position_ids=b["position_ids"])
        b["aux"], b["last"] = aux, last
        return b

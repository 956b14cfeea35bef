"""The hf extraction backend: run the target in this process over a PREPARED dataset into the STORE.

The command (`eyas extract`, eyas/extract.py) picks this backend or vLLM's (eyas/engines/vllm_extract.py);
both plan and resume through `begin_store` here, so their stores are interchangeable.

The compute loop only launches work: rows of consecutive shards (at least a batch's worth) are
sorted by length and grouped into batches of at most `token_budget` tokens (rows padded to the
batch's longest, so sorting keeps the waste small; with flash_attention_2 a batch is one packed row
and there is no padding at all). Hook-captured states are encoded (bf16 or fp8) on the device,
copied to pinned host memory on a side stream, and handed to `ShardWriter`, whose threads wait for
the copy, assemble shards, hash and write them while the device runs the next batch.

Under torchrun each rank extracts shards j % WORLD_SIZE == RANK; ranks do not communicate, and
whichever finishes last merges the per-rank manifests (see `writer.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eyas.data import PreparedDataset
from eyas.progress import Progress
from eyas.store.format import DTYPES, MANIFEST, StoreError, bytes_per_token, encode_states
from eyas.store.reader import load_manifest
from eyas.store.writer import (ShardPlan, ShardWriter, clean_temp_files, completed_shards, crash_point, merge,
                               samples_per_shard, store_lock)
from eyas.target.capture import backbone_of, capture


# ---------------------------------------------------------------- data


def data_fingerprint(dataset) -> dict[str, Any]:
    """Identifies the prepared data a store was made from (rows + manifest hash), not where it lives."""
    manifest = getattr(dataset, "manifest", None) or {}
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()
    return {"rows": len(dataset), "manifest_sha256": digest}


def prepared_row(dataset, i: int, vocab_size: int) -> dict[str, torch.Tensor]:
    r = dataset[i]
    ids, mask, pos = r["input_ids"], r["loss_mask"], r["position_ids"]
    if ids.dim() != 1 or ids.shape != mask.shape or ids.shape != pos.shape or ids.numel() == 0:
        raise StoreError(f"prepared row {i}: input_ids {tuple(ids.shape)}, loss_mask {tuple(mask.shape)}, "
                         f"position_ids {tuple(pos.shape)} must be equal non-empty 1-D shapes")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise StoreError(f"prepared row {i}: token id {int(ids.max())} outside the target vocabulary "
                         f"(size {vocab_size}); was the data prepared for another tokenizer?")
    return {"input_ids": ids.long(), "loss_mask": mask.bool(), "position_ids": pos.long()}


def make_batches(lengths: dict[int, int], token_budget: int) -> list[list[int]]:
    """Rows longest-first, greedily grouped so rows x longest <= budget (a longer row goes alone)."""
    order = sorted(lengths, key=lambda r: (-lengths[r], r))
    batches: list[list[int]] = []
    for r in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(r)
        else:
            batches.append([r])
    return batches


def _pad(rows: list[dict[str, torch.Tensor]], packed: bool) -> dict[str, torch.Tensor]:
    """[B, Tmax] (right padding; padded positions continue the last document, so they never start a new
    one and causal attention keeps them out of every real token's view) or [1, sum T] when packed."""
    if packed:
        return {k: torch.cat([r[k] for r in rows]).unsqueeze(0) for k in rows[0]}
    T = max(r["input_ids"].numel() for r in rows)
    out = {"input_ids": torch.zeros(len(rows), T, dtype=torch.long),
           "loss_mask": torch.zeros(len(rows), T, dtype=torch.bool),
           "position_ids": torch.zeros(len(rows), T, dtype=torch.long)}
    for b, r in enumerate(rows):
        n = r["input_ids"].numel()
        out["input_ids"][b, :n] = r["input_ids"]
        out["loss_mask"][b, :n] = r["loss_mask"]
        out["position_ids"][b, :n] = r["position_ids"]
        out["position_ids"][b, n:] = r["position_ids"][-1] + 1 + torch.arange(T - n)
    return out


# ---------------------------------------------------------------- the loop
class HostCopier:
    """Device -> pinned host copies on a side stream; the writer waits on the returned event."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def __call__(self, tensors: dict[str, torch.Tensor]):
        if not self.cuda:
            return {k: v.cpu() for k, v in tensors.items()}, None
        self.stream.wait_stream(torch.cuda.current_stream())
        host = {}
        with torch.cuda.stream(self.stream):
            for k, v in tensors.items():
                host[k] = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                host[k].copy_(v, non_blocking=True)
                v.record_stream(self.stream)     # keep v's memory until the copy is done
            event = torch.cuda.Event()
            event.record(self.stream)
        return host, event


@dataclass
class StoreJob:
    """One rank's share of a store: the plan, what is already done, and the shards left to write."""
    out: Path
    plan: ShardPlan
    header: dict[str, Any]
    done: dict[int, dict[str, Any]]
    todo: list[int]
    token_bytes: int

    def writer(self, rank: int, threads: int, max_pending: int = 4) -> ShardWriter:
        return ShardWriter(self.out, rank, self.header, self.plan, threads=threads, skip=set(self.done),
                           max_pending=max_pending)

    def groups(self, rank: int, world: int) -> list[list[int]]:
        """This rank's shard groups that still have a shard to write (whole groups: see ShardPlan.groups)."""
        todo = set(self.todo)
        return [g for g in self.plan.groups(rank, world) if any(j in todo for j in g)]

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        crash_point("before-merge")
        manifest = merge(self.out, self.header, self.plan)
        release_rank(self.out, summary.get("rank", 0))
        return {"out": str(self.out), **summary, "samples": self.plan.num_samples, "shards": self.plan.num_shards,
                "shards_written": len(self.todo), "shards_resumed": len(self.done),
                "bytes_per_token": self.token_bytes, "merged": manifest is not None}


def begin_store(dataset, out: str | os.PathLike, identity: dict[str, Any], *, shard_mb: float = 256.0,
                limit: int | None = None, rank: int = 0, world: int = 1,
                token_budget: int = 0) -> StoreJob | dict[str, Any]:
    """Plan the store and find this rank's remaining shards (a summary dict when it is already complete).

    Both backends go through here, so their stores are interchangeable and resume each other."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = identity["dtype"]
    if dtype not in DTYPES:
        raise StoreError(f"store dtype {dtype!r}: choose one of {DTYPES}")
    n = min(len(dataset), limit) if limit else len(dataset)
    if n == 0:
        raise StoreError("the prepared dataset has no rows")
    token_bytes = bytes_per_token(identity["hidden_size"], len(identity["aux_layer_ids"]), dtype)
    max_len = int((getattr(dataset, "manifest", None) or {}).get("max_length") or 0) or \
        max(int(dataset[i]["input_ids"].numel()) for i in range(n))
    per_shard = samples_per_shard(shard_mb, max_len, token_bytes)
    plan = ShardPlan(n, per_shard, max(1, -(-token_budget // (per_shard * max_len))))
    header = {"target": identity, "data": data_fingerprint(dataset), "num_samples": n,
              "samples_per_shard": plan.samples_per_shard}
    hold_rank(out, rank)
    if (out / MANIFEST).is_file():
        try:
            m = load_manifest(out)
        except StoreError:
            m = None                        # torn or damaged: rebuilt from the rank manifests below
        if m is not None and not all(m.get(k) == v for k, v in header.items()):
            raise StoreError(f"{out / MANIFEST}: a finished store made with other settings is there; "
                             f"use a new --out or --overwrite")
    done = completed_shards(out, header)    # sha256-checked: a damaged shard is redone, not trusted
    if len(done) == plan.num_shards and _manifest_is_whole(out, header, done):
        release_rank(out, rank)
        return {"out": str(out), "status": "complete (nothing to do)", "samples": n,
                "tokens": sum(e["tokens"] for e in done.values()), "shards": plan.num_shards, "merged": True}
    todo = [j for j in plan.mine(rank, world) if j not in done]
    clean_temp_files(out, todo)
    return StoreJob(out, plan, header, done, todo, token_bytes)


_HELD: dict[tuple[str, int], Any] = {}


def hold_rank(out: Path, rank: int) -> None:
    """One writer per (store, rank): a second `extract` on the same --out fails at once with a clear
    line instead of racing (this process may re-enter: tests and the demo call extract repeatedly)."""
    key = (str(Path(out).resolve()), rank)
    if key not in _HELD:
        _HELD[key] = store_lock(out, f"rank-{rank}", wait=False).__enter__()


def release_rank(out: Path, rank: int) -> None:
    lock = _HELD.pop((str(Path(out).resolve()), rank), None)
    if lock is not None:
        lock.__exit__(None, None, None)


def _manifest_is_whole(out: Path, header: dict[str, Any], done: dict[int, dict[str, Any]]) -> bool:
    """manifest.json is there, readable, and lists exactly the verified shards (else merge rewrites it)."""
    try:
        m = load_manifest(out)
    except StoreError:
        return False
    shards = m.get("shards")
    return isinstance(shards, list) and len(shards) == len(done) and all(
        isinstance(e, dict) and done.get(e.get("shard")) == e for e in shards)


@torch.inference_mode()
def extract_to_store(model: torch.nn.Module, layout, dataset, out: str | os.PathLike, *, identity: dict[str, Any],
                     token_budget: int = 16384, shard_mb: float = 256.0, writer_threads: int = 2,
                     limit: int | None = None, rank: int = 0, world: int = 1, packed: bool = False,
                     device: torch.device | str | None = None, max_pending: int = 4) -> dict[str, Any]:
    """Extract `dataset` rows (or the first `limit`) into the store at `out`; resumable; returns a summary."""
    job = begin_store(dataset, out, identity, shard_mb=shard_mb, limit=limit, rank=rank, world=world,
                      token_budget=token_budget)
    if isinstance(job, dict):
        return job
    try:
        return _extract(job, model, layout, dataset, identity, token_budget, writer_threads, rank, world, packed,
                        device, max_pending)
    finally:
        release_rank(job.out, rank)


def _extract(job: StoreJob, model, layout, dataset, identity, token_budget, writer_threads, rank, world, packed,
             device, max_pending) -> dict[str, Any]:
    """The compute loop of extract_to_store (which holds this rank's store lock around it)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    aux_ids, dtype = identity["aux_layer_ids"], identity["dtype"]
    plan = job.plan
    backbone = backbone_of(model, layout)
    copier = HostCopier(device)
    writer = job.writer(rank, writer_threads, max_pending)

    t_start = time.perf_counter()
    tokens = padded = 0
    bar = Progress(f"extract (rank {rank})" if world > 1 else "extract",
                   sum(len(plan.rows(j)) for g in job.groups(rank, world) for j in g), "rows")
    try:
        # Batches span a group of shards (small shards keep the final write short, big batches keep the
        # device busy); a group's shards are closed together once all its batches are handed over.
        for group in job.groups(rank, world):
            rows = {i: prepared_row(dataset, i, identity["vocab_size"]) for j in group for i in plan.rows(j)}
            lengths = {i: r["input_ids"].numel() for i, r in rows.items()}
            for batch in make_batches(lengths, token_budget):
                x = _pad([rows[i] for i in batch], packed)
                # pinned, so the upload is truly asynchronous: from pageable memory CUDA first waits for the
                # stream, i.e. for the previous batch's forward, and the GPU idles while this batch is launched
                pin = (lambda t: t.pin_memory()) if copier.cuda else (lambda t: t)
                ids = pin(x["input_ids"]).to(device, non_blocking=True)
                pos = pin(x["position_ids"]).to(device, non_blocking=True)
                with capture(layout, aux_ids) as cap:
                    backbone(input_ids=ids, position_ids=pos, use_cache=False)
                    aux, last = cap.aux, cap.last
                enc = encode_states(aux, last, dtype)
                enc["finite"] = torch.isfinite(aux).flatten(2).all(-1) & torch.isfinite(last).all(-1)
                host, ready = copier(enc)
                host.update(input_ids=x["input_ids"], loss_mask=x["loss_mask"], position_ids=x["position_ids"])
                lens = [lengths[i] for i in batch]
                writer.add(batch, lens, host, ready, packed=packed)
                tokens += sum(lens)
                padded += ids.numel()
                bar.update(len(batch))
                bar.note(f"{tokens / (time.perf_counter() - t_start):.0f} tok/s")
            for j in group:
                if j not in writer.skip:
                    writer.finish_shard(j)
        t_loop = time.perf_counter() - t_start
    finally:
        try:
            writer.close()
        finally:   # a writer that fails to close must not leave the bar's heartbeat thread printing
            bar.close()
    elapsed = time.perf_counter() - t_start
    return job.finish({"rank": rank, "world": world, "dtype": dtype, "aux_layer_ids": aux_ids, "tokens": tokens,
                       "padding_fraction": round(1 - tokens / padded, 4) if padded else 0.0,
                       "seconds": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1) if elapsed else None,
                       "writer_stall_s": round(writer.stall_s, 3), "writer_busy_s": round(writer.write_s, 3),
                       # the loop (every batch handed to the writer) vs the one-off final flush of the last
                       # batches: on a short run the flush is a large share, on a long one it vanishes
                       "loop_s": round(t_loop, 3), "flush_s": round(elapsed - t_loop, 3)})

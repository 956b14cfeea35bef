"""Writing a store: the shard plan, background shard writers, per-rank manifests and their merge.

Crash safety rests on three rules:
  1. The plan is a pure function of (dataset, settings): shard j always holds samples
     [j*S, min((j+1)*S, n)), so a restart (any world size) recomputes the same shards.
  2. A shard file appears only whole (temp file, fsync, rename, fsync dir); it counts as done only
     once its entry (size + sha256) is in a rank manifest `rank-R.json`, itself written atomically.
  3. The merged `manifest.json` is keyed by shard id, so a shard redone after a crash replaces the
     old file and can never contribute its samples twice.
kill -9 at any point therefore loses at most the shards in flight. Ranks never talk to each other:
each one, when it finishes, tries the merge; the last to finish writes the (deterministic) manifest.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eyas import __version__
from eyas.store.format import (FORMAT, FORMAT_VERSION, ID_DTYPE, MANIFEST, StoreError, atomic_write_json, fsync_dir,
                               read_json, shard_name, write_safetensors)


# ---------------------------------------------------------------- crash hooks (tests)
def crash_point(name: str) -> None:
    """Test hook: with EYAS_STORE_PAUSE_AT=name, announce the point in $EYAS_STORE_PAUSE_MARK and hang,
    so a test can SIGKILL the process at exactly this moment. A no-op otherwise."""
    if os.environ.get("EYAS_STORE_PAUSE_AT") != name:
        return
    mark = os.environ.get("EYAS_STORE_PAUSE_MARK")
    if mark:
        Path(mark).write_text(name)
    time.sleep(3600)


# ---------------------------------------------------------------- plan
@dataclass(frozen=True)
class ShardPlan:
    num_samples: int
    samples_per_shard: int
    shards_per_group: int = 1           # shards batched together (one batch's worth of tokens)

    @property
    def num_shards(self) -> int:
        return -(-self.num_samples // self.samples_per_shard)

    def shard_of(self, row: int) -> int:
        return row // self.samples_per_shard

    def rows(self, j: int) -> range:
        return range(j * self.samples_per_shard, min((j + 1) * self.samples_per_shard, self.num_samples))

    def groups(self, rank: int, world: int) -> list[list[int]]:
        """Rank r's disjoint slice: groups g with g % world == r (interleaved, so ranks stay balanced).

        Groups are fixed by the plan, not by what is left to do, so every shard is always computed in the
        same batches: a shard's bytes do not depend on ranks or restarts."""
        G = self.shards_per_group
        return [list(range(g * G, min((g + 1) * G, self.num_shards)))
                for g in range(-(-self.num_shards // G)) if g % world == rank]

    def mine(self, rank: int, world: int) -> list[int]:
        return [j for group in self.groups(rank, world) for j in group]


def samples_per_shard(shard_mb: float, max_row_tokens: int, token_bytes: int) -> int:
    return max(1, int(shard_mb * 2**20) // max(1, max_row_tokens * token_bytes))


# ---------------------------------------------------------------- rank manifests
def rank_manifest_path(out: Path, rank: int) -> Path:
    return out / f"rank-{rank}.json"


def read_rank_manifests(out: Path) -> list[dict[str, Any]]:
    return [read_json(p, "rank manifest") for p in sorted(out.glob("rank-*.json"))]


def completed_shards(out: Path, header: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Shards recorded by any rank whose file is still there at the recorded size.

    A rank manifest made with different settings is an error, not a silent mix of two stores."""
    done: dict[int, dict[str, Any]] = {}
    for m in read_rank_manifests(out):
        for key, want in header.items():
            if m.get(key) != want:
                raise StoreError(f"{out}: rank manifest rank-{m.get('rank')}.json was written with different "
                                 f"settings ({key}: {m.get(key)!r} there, {want!r} now); use a new --out or "
                                 f"--overwrite")
        for entry in m.get("shards", []):
            p = out / entry["file"]
            if p.is_file() and p.stat().st_size == entry["bytes"]:
                done[int(entry["shard"])] = entry
    return done


def merge(out: Path, header: dict[str, Any], plan: ShardPlan) -> dict[str, Any] | None:
    """Write manifest.json when every planned shard is done; return it, or None while some are missing."""
    done = completed_shards(out, header)
    if any(j not in done for j in range(plan.num_shards)):
        return None
    shards = [done[j] for j in range(plan.num_shards)]
    manifest = {**header, "format": FORMAT, "format_version": FORMAT_VERSION, "eyas_version": __version__,
                "num_samples": plan.num_samples, "num_tokens": sum(s["tokens"] for s in shards),
                "num_shards": plan.num_shards, "shards": shards}
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


# ---------------------------------------------------------------- shard writer
@dataclass
class _Shard:
    j: int
    rows: range
    parts: dict[int, dict[str, torch.Tensor]]    # row -> its tensors (views into host batches)


class ShardWriter:
    """Takes finished batches from the compute loop and writes shards on background threads.

    `add(rows, lengths, host, ready)` hands over one batch: `host` maps names to host tensors with
    a leading batch dim (padded to the batch's longest row); `ready` is an optional CUDA event the
    device->host copy records, waited on here rather than in the compute loop. A bounded queue gives
    back-pressure when the disk is slower than the model. Errors on the threads surface in `add` /
    `close`.
    """

    def __init__(self, out: Path, rank: int, header: dict[str, Any], plan: ShardPlan, *, threads: int = 2,
                 max_pending: int = 4, skip: set[int] = frozenset()):
        self.out, self.rank, self.header, self.plan, self.skip = out, rank, header, plan, set(skip)
        self._shards: dict[int, _Shard] = {}
        self._entries: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        # Only batches count against back-pressure: "close shard" messages are tiny, and blocking the compute
        # loop on them would stall the device while the writer threads are merely busy.
        self._q: queue.Queue = queue.Queue()
        self._batches = threading.Semaphore(max(1, max_pending))
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="eyas-shard")
        self._futures: list[Future] = []
        self._inflight = threading.Semaphore(max(1, threads) + 1)   # whole shards held in memory at once
        self._error: BaseException | None = None
        self.stall_s = 0.0                  # compute loop time spent waiting for the writer
        self.write_s = 0.0                  # time the threads spent serialising, hashing and writing
        prev = rank_manifest_path(out, rank)
        if prev.is_file():                  # keep what this rank finished before a crash
            for e in read_json(prev, "rank manifest").get("shards", []):
                self._entries[int(e["shard"])] = e
        self._thread = threading.Thread(target=self._assemble, name="eyas-assemble", daemon=True)
        self._thread.start()

    # ------------------------------------------------ compute-loop side
    def add(self, rows: list[int], lengths: list[int], host: dict[str, torch.Tensor], ready=None,
            packed: bool = False) -> None:
        self._raise()
        t0 = time.perf_counter()
        self._batches.acquire()
        self.stall_s += time.perf_counter() - t0
        self._q.put(("batch", rows, lengths, host, ready, packed))

    def finish_shard(self, j: int) -> None:
        self._raise()
        self._q.put(("close", j))

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        for f in self._futures:
            f.result()                      # _write keeps its own errors in self._error
        self._pool.shutdown(wait=True)
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise StoreError(f"shard writer failed: {self._error}") from self._error

    # ------------------------------------------------ background side
    def _assemble(self) -> None:
        while (item := self._q.get()) is not None:
            if item[0] == "batch":
                self._batches.release()                  # even when draining after an error: never block add()
            if self._error is not None:
                continue
            try:
                if item[0] == "batch":
                    _, rows, lengths, host, ready, packed = item
                    if ready is not None:
                        ready.synchronize()
                    finite = host.pop("finite")
                    start = 0
                    for b, (row, n) in enumerate(zip(rows, lengths)):
                        j = self.plan.shard_of(row)       # a batch may hold rows of several shards
                        if j in self.skip:                # recomputed only to keep batches identical
                            start += n
                            continue
                        shard = self._shards.setdefault(j, _Shard(j, self.plan.rows(j), {}))
                        # padded batch: row b is [b, :n]; packed batch: one row, samples side by side
                        b, a = (0, start) if packed else (b, 0)
                        if not bool(finite[b, a:a + n].all()):
                            raise StoreError(f"prepared row {row}: the target produced NaN/Inf hidden states")
                        shard.parts[row] = {k: v[b, a:a + n] for k, v in host.items()}
                        start += n
                else:
                    shard = self._shards.pop(item[1])
                    self._inflight.acquire()
                    self._futures.append(self._pool.submit(self._write, shard))
            except BaseException as e:                  # noqa: BLE001 - handed to the compute loop
                self._error = e

    def _write(self, shard: _Shard) -> None:
        t0 = time.perf_counter()
        try:
            missing = [r for r in shard.rows if r not in shard.parts]
            if missing:
                raise StoreError(f"{shard_name(shard.j)}: samples {missing[:5]} were never computed")
            parts = [shard.parts[r] for r in shard.rows]
            lengths = [int(p["input_ids"].shape[0]) for p in parts]
            cols = {k: [p[k] for p in parts] for k in parts[0]}
            for k in ("input_ids", "position_ids"):
                cols[k] = [x.to(ID_DTYPE) for x in cols[k]]
            cols["offsets"] = [torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)]
            cols["sample_ids"] = [torch.tensor(list(shard.rows), dtype=torch.int64)]
            # One metadata key: equal inputs give byte-identical shards (same sha256 whatever rank wrote them).
            meta = json.dumps({"format": FORMAT + "-shard", "shard": shard.j, "dtype": self.header["target"]["dtype"]},
                              sort_keys=True)
            path = self.out / shard_name(shard.j)
            tmp = path.with_name(path.name + ".tmp")
            # Streamed from the per-sample host tensors: no concatenated copy, no in-memory file.
            with open(tmp, "wb") as f:
                nbytes, sha = write_safetensors(f, cols, {"eyas": meta})
                f.flush()
                os.fsync(f.fileno())
            shard.parts.clear()
            del parts, cols
            if os.environ.get("EYAS_STORE_PAUSE_AT") == "shard-partial":
                os.truncate(tmp, nbytes // 2)          # as if the process died in the middle of write()
                crash_point("shard-partial")
            crash_point("shard-before-rename")
            os.replace(tmp, path)
            fsync_dir(self.out)
            entry = {"shard": shard.j, "file": path.name, "first": shard.rows.start, "count": len(shard.rows),
                     "tokens": sum(lengths), "bytes": nbytes, "sha256": sha}
            crash_point("shard-renamed")
            with self._lock:
                self._entries[shard.j] = entry
                self._save_rank_manifest()
            crash_point("rank-manifest-written")
        except BaseException as e:                       # noqa: BLE001
            self._error = e
        finally:
            with self._lock:
                self.write_s += time.perf_counter() - t0
            self._inflight.release()

    def _save_rank_manifest(self) -> None:
        shards = [self._entries[j] for j in sorted(self._entries)]
        atomic_write_json(rank_manifest_path(self.out, self.rank), {**self.header, "rank": self.rank,
                                                                     "shards": shards})


def clean_temp_files(out: Path, shards: list[int]) -> None:
    """Remove temp files a killed run left for the shards this rank is about to (re)write."""
    for j in shards:
        tmp = out / (shard_name(j) + ".tmp")
        if tmp.exists():
            tmp.unlink()
    if shards:
        fsync_dir(out)

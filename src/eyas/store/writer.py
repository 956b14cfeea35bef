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

from eyas import env
from eyas import __version__
from eyas.faultpoints import pause_at
from eyas.outputs import OutputLock
from eyas.store.format import (FORMAT, FORMAT_VERSION, ID_DTYPE, MANIFEST, StoreError, atomic_write_json, fsync_dir,
                               open_new, read_json, sha256_file, shard_name, write_safetensors)


# ---------------------------------------------------------------- crash hooks (tests)
def crash_point(name: str) -> None:
    """Test hook: with EYAS_STORE_PAUSE_AT=name, announce the point in $EYAS_STORE_PAUSE_MARK and hang,
    so a test can SIGKILL the process at exactly this moment. A no-op otherwise."""
    pause_at("STORE", name)


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
    """Every readable rank manifest. A damaged one (torn, edited) is skipped: its shards are redone,
    which costs time but never a manual delete and never a shard nobody can vouch for."""
    found = []
    for p in sorted(out.glob("rank-*.json")):
        try:
            found.append(read_json(p, "rank manifest"))
        except StoreError:
            continue
    return found


def check_entry(out: Path, entry: Any, where: str) -> None:
    """A manifest's shard entry must name a shard file inside the store by its own name (no paths)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("shard"), int) or \
            entry.get("file") != shard_name(entry["shard"]):
        raise StoreError(f"{out / where}: shard entry {str(entry)[:120]} must have an integer 'shard' and "
                         f"'file' equal to its shard name (no paths outside the store); the manifest is damaged, "
                         f"re-run `eyas extract` on this --out to rebuild it")
    for key in ("first", "count", "tokens", "bytes"):
        if not isinstance(entry.get(key), int) or entry[key] < 0:
            raise StoreError(f"{out / where}: {entry['file']}: '{key}' is {entry.get(key)!r}, expected an integer >= 0")
    if not isinstance(entry.get("sha256"), str):
        raise StoreError(f"{out / where}: {entry['file']}: no sha256")


def shard_ok(out: Path, entry: dict[str, Any], *, sha: bool) -> bool:
    """The shard file is there, a regular file (not a link), at the recorded size (and sha256)."""
    p = out / entry["file"]
    if p.is_symlink() or not p.is_file() or p.stat().st_size != entry["bytes"]:
        return False
    return not sha or sha256_file(p) == entry["sha256"]


def completed_shards(out: Path, header: dict[str, Any], *, sha: bool = True) -> dict[int, dict[str, Any]]:
    """Shards recorded by any rank (or the merged manifest) whose file is still there, whole and unaltered.

    sha=True re-hashes every such shard (resume: a same-size bit flip is redone, not kept); merge uses
    sizes only, right after the shards were hashed. A rank manifest made with different settings is
    an error, not a silent mix of two stores."""
    done: dict[int, dict[str, Any]] = {}
    merged = out / MANIFEST
    sources = read_rank_manifests(out)
    if merged.is_file():
        try:
            m = read_json(merged, "store manifest")
            if all(m.get(k) == v for k, v in header.items()):
                sources.append(m)
        except StoreError:
            pass                            # torn or damaged: it is rebuilt from the rank manifests
    for m in sources:
        if "rank" in m:
            for key, want in header.items():
                if m.get(key) != want:
                    raise StoreError(f"{out}: rank manifest rank-{m.get('rank')}.json was written with different "
                                     f"settings ({key}: {m.get(key)!r} there, {want!r} now); use a new --out or "
                                     f"--overwrite")
        for entry in m.get("shards", []) if isinstance(m.get("shards"), list) else []:
            try:
                check_entry(out, entry, f"rank-{m['rank']}.json" if "rank" in m else MANIFEST)
            except StoreError:
                continue                    # a damaged entry vouches for nothing: that shard is redone
            j = entry["shard"]
            if j not in done and shard_ok(out, entry, sha=sha):
                done[j] = entry
    return done


def merge(out: Path, header: dict[str, Any], plan: ShardPlan) -> dict[str, Any] | None:
    """Write manifest.json when every planned shard is done; return it, or None while some are missing.
    Ranks finishing together take turns (a lock), so each merge sees the others' shards."""
    with store_lock(out, "merge"):
        done = completed_shards(out, header, sha=False)
        if any(j not in done for j in range(plan.num_shards)):
            return None
        shards = [done[j] for j in range(plan.num_shards)]
        manifest = {**header, "format": FORMAT, "format_version": FORMAT_VERSION, "eyas_version": __version__,
                    "num_samples": plan.num_samples, "num_tokens": sum(s["tokens"] for s in shards),
                    "num_shards": plan.num_shards, "shards": shards}
        atomic_write_json(out / MANIFEST, manifest)
        return manifest


# ---------------------------------------------------------------- locks
class store_lock(OutputLock):
    """An exclusive flock on STORE/.lock-NAME (eyas.outputs.OutputLock): one writer per rank (two `extract` runs
    on one --out would race), one merge at a time. A kill never leaves a lock that needs a manual delete."""

    def __init__(self, out: Path, name: str, *, wait: bool = True):
        path = Path(out) / f".lock-{name}"
        super().__init__(path, f"{path.parent}: another `eyas extract` is writing this store ({path.name} is "
                               f"locked); wait for it to finish, or use another --out", wait=wait, error=StoreError)


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
        if prev.is_file():                  # keep what this rank finished before a crash (if still valid)
            ok = completed_shards(out, header, sha=False)
            try:
                old = read_json(prev, "rank manifest").get("shards", [])
            except StoreError:
                old = []
            for e in old if isinstance(old, list) else []:
                if isinstance(e, dict) and ok.get(e.get("shard")) == e:
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
            with os.fdopen(open_new(tmp), "wb") as f:    # never through a planted symlink
                nbytes, sha = write_safetensors(f, cols, {"eyas": meta})
                f.flush()
                os.fsync(f.fileno())
            shard.parts.clear()
            del parts, cols
            if env.get("EYAS_STORE_PAUSE_AT") == "shard-partial":
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
    """Remove temp files a killed run left for the shards this rank is about to (re)write, and torn
    manifest temp files (a link counts: lexists, not exists)."""
    stale = [out / (shard_name(j) + ".tmp") for j in shards] + list(out.glob("*.json.*.tmp"))
    for tmp in stale:
        if os.path.lexists(tmp):
            tmp.unlink()
    if stale:
        fsync_dir(out)

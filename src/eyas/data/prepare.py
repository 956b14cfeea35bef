"""`eyas prepare`: conversations -> token ids, assistant-only loss masks, packed rows, draft vocabulary.

Flow: stream source records -> render + mask in batches (optionally in worker processes) -> overlong policy ->
count token frequencies over masked positions -> pack documents into rows of <= max_length -> shards ->
draft vocabulary -> manifest (last). Every source row ends up either in a packed row or in rejects.jsonl
with its reason; the summary's counts add up (rows_in = rows_out + rows_rejected).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import time
from collections import Counter, deque
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import torch
from pydantic import Field

from eyas.config import StageConfig
from eyas.data.dataset import (FORMAT, MANIFEST, REJECTS, VERSION, VOCAB, PreparedError, PreparedWriter,
                               read_manifest, write_manifest, write_vocab)
from eyas.data.masks import ChatRenderer, MaskError, render_text, template_hash
from eyas.flags import DRAFT_VOCAB_SIZE, CacheDir, DraftVocabSize, JsonSwitch, Target, TrustRemoteCode
from eyas.data.sources import (ASSISTANT_FIRST_DEFAULT, AssistantFirst, Record, iter_conversations, reason_category,
                               resolve_data)
from eyas.outputs import claim, empty
from eyas.target.layers import text_config
from eyas.target.load import load_config, load_tokenizer
from eyas.vocab import build_draft_vocab


class PrepareConfig(StageConfig):
    target: Target
    data: str = Field(description="ShareGPT JSON/JSONL, OpenAI 'messages' JSONL, 'text' JSONL (.gz ok), or built-in 'sharegpt'")
    out: Path = Field(description="output directory (PREPARED format)")
    max_samples: int | None = Field(None, ge=1, description="read at most this many source rows")
    max_length: int = Field(2048, ge=8, description="tokens per packed row (and per conversation)")
    draft_vocab_size: DraftVocabSize = DRAFT_VOCAB_SIZE
    overlong: Literal["truncate", "drop"] = Field("truncate", description="conversations longer than max_length: truncate or drop (reject)")
    assistant_first: AssistantFirst = Field(
        ASSISTANT_FIRST_DEFAULT, description="conversations opening with the assistant: reject, or skip the leading "
                                             "assistant turns")
    pack: bool = Field(True, description="pack several conversations per row (position ids restart per document)")
    chat_template: Path | None = Field(None, description="jinja file overriding the tokenizer's chat template")
    workers: int = Field(0, ge=0, description="worker processes for rendering/tokenising (0 = one per CPU core, at most 8)")
    batch_size: int = Field(128, ge=1, description="conversations per batched tokenizer call")
    shard_rows: int = Field(4096, ge=1, description="packed rows per safetensors shard")
    overwrite: bool = Field(False, description="replace an existing, different prepared dataset in --out")
    cache_dir: CacheDir = None
    trust_remote_code: TrustRemoteCode = False
    json: JsonSwitch = False


# ---------------------------------------------------------------- workers: records -> (row, ids, mask) | reason
_STATE: dict = {}


def _init_worker(target: str, cache, trust_remote_code: bool, template: str | None) -> None:
    tok = load_tokenizer(target, cache=cache, trust_remote_code=trust_remote_code)
    _STATE["renderer"] = ChatRenderer(tok, template)


def _encode_batch(batch: list[tuple[int, list | None, str | None]], renderer: ChatRenderer | None = None):
    """[(row, messages, text)] -> [(row, ids, mask, None) | (row, None, None, reason)] in order."""
    renderer = renderer or _STATE["renderer"]
    chats = [(row, msgs) for row, msgs, _ in batch if msgs is not None]
    masked = dict(zip([r for r, _ in chats], renderer.masks([m for _, m in chats]))) if chats else {}
    out = []
    for row, msgs, text in batch:
        try:
            res = masked[row] if msgs is not None else render_text(renderer.tokenizer, text)
        except Exception as e:  # noqa: BLE001 - a tokenizer failing on one text must not end the run
            res = MaskError(f"tokenizer_error: {type(e).__name__}: {str(e)[:200]}")
        if isinstance(res, MaskError):
            out.append((row, None, None, str(res)))
        else:
            out.append((row, res[0], res[1], None))
    return out


# ---------------------------------------------------------------- packing
class Packer:
    """First-fit-decreasing over a window of documents: few rows, little padding, deterministic."""

    def __init__(self, max_length: int, pack: bool = True, window: int = 1024):
        self.max_length, self.pack, self.window = max_length, pack, window
        self.buf: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, doc: tuple[np.ndarray, np.ndarray]) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        if not self.pack:
            return [[doc]]
        self.buf.append(doc)
        return self.flush() if len(self.buf) >= self.window else []

    def flush(self) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        bins: list[list] = []
        room: list[int] = []
        for doc in sorted(self.buf, key=lambda d: -len(d[0])):
            n = len(doc[0])
            for b, r in enumerate(room):
                if r >= n:
                    bins[b].append(doc)
                    room[b] -= n
                    break
            else:
                bins.append([doc])
                room.append(self.max_length - n)
        self.buf = []
        return bins


# ---------------------------------------------------------------- the run
def _config_key(cfg: PrepareConfig, data_path: Path, tpl_hash: str) -> str:
    st = data_path.stat()
    keep = cfg.model_dump(mode="json", exclude={"out", "json", "overwrite", "workers", "batch_size", "cache_dir"})
    blob = json.dumps({"cfg": keep, "data": [str(data_path.resolve()), st.st_size, int(st.st_mtime)],
                       "template": tpl_hash, "version": VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _prepare_out(out: Path, key: str, overwrite: bool) -> dict | None:
    """The existing summary when `out` (claimed: eyas.outputs) already holds this exact dataset; else empty it."""
    if (out / MANIFEST).is_file() and not overwrite:
        try:
            old = read_manifest(out)
        except ValueError:
            old = {}
        if old.get("config_key") == key:
            return old
        raise ValueError(f"{out} already holds a different prepared dataset; pass --overwrite to replace it")
    empty(out)  # the claim made sure it holds a prepared dataset's files only (a crashed run's leftovers)
    return None


# What `prepare` records as its settings: the flags that change the dataset (inputs are recorded by content).
_NOT_SETTINGS = {"target", "data", "chat_template", "out", "json", "overwrite", "workers", "batch_size", "cache_dir"}


def _records(cfg: PrepareConfig) -> Iterator[Record]:
    return iter_conversations(cfg.data, limit=cfg.max_samples, cache=cfg.cache_dir,
                              skip_leading_assistant=cfg.assistant_first == "skip")


def _batches(records: Iterator[Record], size: int, rejects, counts: Counter):
    batch: list[tuple[int, list | None, str | None]] = []
    ids: dict[int, str | None] = {}
    for rec in records:
        counts["rows_in"] += 1
        if not rec.ok:
            _reject(rejects, counts, rec.row, rec.id, rec.reason)
            continue
        batch.append((rec.row, rec.messages, rec.text))
        ids[rec.row] = rec.id
        if len(batch) >= size:
            yield batch, ids
            batch, ids = [], {}
    if batch:
        yield batch, ids


def _reject(fh, counts: Counter, row: int, rid: str | None, reason: str) -> None:
    # ensure_ascii: a reason quoting undecodable source bytes (surrogate escapes) must still be writable
    fh.write(json.dumps({"row": row, "id": rid, "reason": reason}) + "\n")
    counts["reject:" + reason_category(reason)] += 1


def prepare(cfg: PrepareConfig) -> dict:
    """Run the data stage; returns the summary (also stored in the manifest)."""
    t0 = time.perf_counter()
    data_path = resolve_data(cfg.data, cfg.cache_dir)
    template = cfg.chat_template.read_text() if cfg.chat_template else None
    tokenizer = load_tokenizer(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    try:
        # a wrapper's (Llava, Kimi-K2.5) vocabulary is its text model's
        V = int(text_config(load_config(cfg.target, cache=cfg.cache_dir,
                                        trust_remote_code=cfg.trust_remote_code)).vocab_size)
    except (OSError, ValueError, AttributeError, TypeError):
        V = len(tokenizer)  # a tokenizer-only directory: its own size is the vocabulary
    renderer = ChatRenderer(tokenizer, template)  # raises MaskError early when there is no template
    tpl_hash = template_hash(tokenizer, template)
    key = _config_key(cfg, data_path, tpl_hash)
    with claim(cfg.out, "prepared", overwrite=cfg.overwrite, cache=cfg.cache_dir,
               inputs={"target": cfg.target, "data": data_path, "chat_template": cfg.chat_template},
               settings=cfg.model_dump(mode="json", exclude=_NOT_SETTINGS)) as held:
        existing = _prepare_out(held.path, key, cfg.overwrite)
        if existing is not None:
            return {**existing["summary"], "reused": True}
        return _prepare(cfg, held.path, data_path, tokenizer, renderer, V, tpl_hash, key, t0)


def _prepare(cfg: PrepareConfig, out: Path, data_path: Path, tokenizer, renderer, V: int, tpl_hash: str, key: str,
             t0: float) -> dict:
    """The data stage into a claimed, empty `out`."""
    template = cfg.chat_template.read_text() if cfg.chat_template else None
    counts: Counter = Counter()
    freq = np.zeros(V, dtype=np.int64)
    writer = PreparedWriter(out, cfg.shard_rows)
    packer = Packer(cfg.max_length, cfg.pack)
    workers = cfg.workers or min(8, os.cpu_count() or 1)
    pool = None
    with open(out / (REJECTS + ".tmp"), "w") as rejects:
        batches = _batches(_records(cfg), cfg.batch_size, rejects, counts)
        if workers > 1:
            # workers parallelise across processes; Rust threads inside each would only oversubscribe the cores
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            if "fork" in mp.get_all_start_methods():  # children inherit the loaded tokenizer: no reload
                _STATE["renderer"] = renderer
                pool = mp.get_context("fork").Pool(workers)
            else:
                pool = mp.get_context("spawn").Pool(workers, _init_worker, (cfg.target, cfg.cache_dir,
                                                                           cfg.trust_remote_code, template))
            it = _pool_results(pool, batches, depth=2 * workers)
        else:
            it = ((_encode_batch(b, renderer), i) for b, i in batches)
        try:
            from tqdm import tqdm

            bar = tqdm(desc="prepare", unit=" rows", total=cfg.max_samples, disable=None)
            for results, ids in it:
                masked = []
                for row, tok_ids, mask, reason in results:
                    if reason is None:
                        reason, tok_ids, mask = _apply_length(cfg, tok_ids, mask, V, counts)
                    if reason is not None:
                        _reject(rejects, counts, row, ids.get(row), reason)
                        continue
                    counts["rows_out"] += 1
                    masked.append(tok_ids[mask])
                    for packed in packer.add((tok_ids, mask)):
                        writer.add(packed)
                if masked:  # one V-sized bincount per batch, not per conversation
                    freq += np.bincount(np.concatenate(masked), minlength=V)
                bar.update(counts["rows_in"] - bar.n)
            bar.close()
        finally:
            _STATE.clear()
            if pool is not None:
                pool.terminate()
    for packed in packer.flush():
        writer.add(packed)
    writer.flush()
    os.replace(out / (REJECTS + ".tmp"), out / REJECTS)
    if counts["rows_out"] == 0:
        raise PreparedError(_nothing_kept(cfg, counts, out))

    freq_t = torch.from_numpy(freq)
    d2t, t2d, coverage = build_draft_vocab(freq_t, cfg.draft_vocab_size)
    write_vocab(out, d2t, t2d, freq_t)
    seconds = time.perf_counter() - t0
    summary = _summary(cfg, counts, writer, freq, d2t, coverage, seconds)
    write_manifest(out, {
        "format": FORMAT, "format_version": VERSION, "config_key": key,
        "target": {"name": cfg.target, "vocab_size": V, "tokenizer_len": len(tokenizer),
                   "tokenizer_class": type(tokenizer).__name__, "chat_template_sha256": tpl_hash},
        "data": {"spec": cfg.data, "path": str(data_path)},
        "max_length": cfg.max_length, "packed": cfg.pack, "overlong": cfg.overlong,
        "shards": writer.shards, "vocab": VOCAB, "rejects": REJECTS, "summary": summary,
        "config": cfg.model_dump(mode="json"),
    })
    return summary


def _nothing_kept(cfg: PrepareConfig, counts: Counter, out: Path) -> str:
    """Why a run kept no row, in one line (an empty file, a non-JSON file, a wrong schema all end here)."""
    if counts["rows_in"] == 0:
        return f"--data {cfg.data}: no rows (the file is empty or holds only blank lines)"
    top = Counter({k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("reject:")}).most_common(3)
    return (f"--data {cfg.data}: all {counts['rows_in']} rows rejected ({', '.join(f'{k}: {v}' for k, v in top)}); "
            f"the reasons per row are in {out / REJECTS}. Is it ShareGPT JSON, messages or text JSONL?")


def _pool_results(pool, batches, depth: int):
    """Ordered results with at most `depth` batches in flight: memory stays flat on any file size, and the
    source is read (and rejects written) only from this thread."""
    pending: deque = deque()
    for batch, ids in batches:
        pending.append((pool.apply_async(_encode_batch, (batch,)), ids))
        if len(pending) >= depth:
            res, i = pending.popleft()
            yield res.get(), i
    while pending:
        res, i = pending.popleft()
        yield res.get(), i


def _apply_length(cfg: PrepareConfig, ids: np.ndarray, mask: np.ndarray, V: int, counts: Counter):
    if len(ids) and int(ids.max()) >= V:
        return f"token_out_of_range: token id {int(ids.max())} >= target vocab size {V}", None, None
    if len(ids) > cfg.max_length:
        if cfg.overlong == "drop":
            return f"overlong: {len(ids)} tokens > max_length {cfg.max_length}", None, None
        ids, mask = ids[: cfg.max_length], mask[: cfg.max_length]
        if not mask.any():
            return f"overlong: no assistant token within the first {cfg.max_length} tokens", None, None
        counts["truncated"] += 1
    return None, ids, mask


def _summary(cfg, counts: Counter, writer: PreparedWriter, freq: np.ndarray, d2t, coverage: float, seconds: float) -> dict:
    by_reason = {k.split(":", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("reject:")}
    tokens = sum(s["tokens"] for s in writer.shards)
    rows = sum(s["rows"] for s in writer.shards)
    return {
        "rows_in": counts["rows_in"], "rows_out": counts["rows_out"],
        "rows_rejected": sum(by_reason.values()), "rejected_by_reason": by_reason,
        "truncated": counts["truncated"], "packed_rows": rows, "tokens": tokens,
        "masked_tokens": int(freq.sum()), "draft_vocab_size": int(d2t.numel()), "coverage": round(coverage, 6),
        "packing_efficiency": round(tokens / (rows * cfg.max_length), 4) if rows else 0.0,
        "seconds": round(seconds, 2), "rows_per_s": round(counts["rows_in"] / seconds, 1) if seconds else 0.0,
        "out": str(cfg.out),
    }


def report(summary: dict, as_json: bool):
    """What `run` hands the CLI: the summary itself for --json, else a printed table and exit code 0."""
    if as_json:
        return summary
    for k, v in summary.items():
        print(f"{k:<20} {v}")
    return 0


def run(cfg: PrepareConfig):
    return report(prepare(cfg), cfg.json)

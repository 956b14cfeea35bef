"""`eyas train --warm-only`: the training step's compiles, done before its data exists.

A compiled online run spends its first ~minute compiling (the target's layers, the draft's layer, flex attention
forward and backward, the loss chunks) before step 1. The graphs depend on shapes and dtypes only — the padded row
length, batch size, TTT steps, draft vocabulary size — never on the token values, and inductor keeps them in its
on-disk cache. So a process given the real run's flags trains a few steps on stand-in rows of those shapes and
exits; the real run, started later on the real data, finds the cache warm. `eyas demo` runs it beside regenerate.

The stand-in rows go through the real data stage (`prepare`), so the PREPARED dir is exactly what a real one looks
like: only the words are random.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from eyas.outputs import claim

WARM_STEPS = 3   # step 1 compiles the forward and backward; the rest catch graphs that first differ at step 2


def stand_in_conversations(path: Path, tokenizer, *, rows: int, max_length: int, seed: int = 0) -> Path:
    """ROWS conversations of random lowercase words as 'messages' JSONL, each about half of MAX_LENGTH tokens of
    TOKENIZER's (so that two pack into a row and none is cut to an empty answer)."""
    rnd = random.Random(seed)
    word = lambda: "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 8)))
    sample = " ".join(word() for _ in range(64))
    per_word = max(1.0, len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / 64)
    n_user, n_answer = max(2, int(0.05 * max_length / per_word)), max(4, int(0.35 * max_length / per_word))
    with open(path, "w") as f:
        for _ in range(rows):
            user = " ".join(word() for _ in range(n_user))
            answer = " ".join(word() for _ in range(n_answer))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


def warm_only(cfg, train) -> dict:
    """Train WARM_STEPS steps of cfg's shapes on stand-in rows under cfg.out (nothing else is written), with the
    real run's `train` (loop.train: passed in, as loop is where this is called from)."""
    if not cfg.online:
        raise ValueError("--warm-only warms an online run (--online): an offline run's shapes come from its store")
    if not cfg.max_length or not cfg.draft_vocab_size:
        raise ValueError("--warm-only needs --max-length and --draft-vocab-size: the real run's row length and "
                         "draft vocabulary (its data does not exist yet)")
    t0 = time.perf_counter()
    with claim(cfg.out, "run", inputs={"target": cfg.target, "data": cfg.data}, settings={"warm_only": True}) as held:
        return _warm(cfg, train, held.path, t0)


def _warm(cfg, train, work: Path, t0: float) -> dict:
    """warm_only into its claimed directory: stand-in.jsonl, prepared/ and run/ (each claimed by its stage)."""
    from eyas.data.prepare import PrepareConfig, prepare
    from eyas.target.load import load_tokenizer

    # enough packed rows for WARM_STEPS batches after the held-out share, 2 conversations to a row
    need = (WARM_STEPS + 2) * cfg.batch_size * cfg.grad_accum
    rows = int(2 * need / (1 - cfg.eval_fraction)) + 4
    conv = stand_in_conversations(work / "stand-in.jsonl", load_tokenizer(cfg.target), rows=rows,
                                  max_length=cfg.max_length, seed=cfg.seed)
    prepare(PrepareConfig(target=cfg.target, data=str(conv), out=work / "prepared", max_length=cfg.max_length,
                          draft_vocab_size=cfg.draft_vocab_size, workers=1, overwrite=True))
    out = train(cfg.model_copy(update=dict(
        warm_only=False, data=work / "prepared", out=work / "run", steps=WARM_STEPS, eval_every=2,
        save_every=10**9, overwrite=True, resume=False, tensorboard=False, progress=False, draft_vocab_size=None)))
    return {"warm_only": True, "steps": out.get("steps"), "seconds": round(time.perf_counter() - t0, 1)}

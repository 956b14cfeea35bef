"""A file cache of `eyas eval`'s AR baseline, so many drafts of one target are measured against one baseline.

The baseline (the target alone, greedy or sampled) is half of an eager Spec-Bench eval's time and does not depend
on the draft: a scaling curve evaluates a dozen drafts of the same target on the same questions. An entry is found
only when everything the baseline's tokens depend on is the same: the target's weights (a sample of every tensor),
dtype, device and software, the runner's settings (compile, inner mode, KV buckets, capacity), the questions and
their prompts' template, new tokens, temperature, seed and stop ids. Anything else misses and the baseline is
generated (and stored) again, so a stale entry cannot be read.

Its tokens are the baseline's identity; its timings are wall-clock, true only of the process that measured them
(another host, thread count or a busy neighbour changes them, and no key can see that). So before an entry is used,
`retime` decodes RETIMED of its turns again in this process, spread over the order they were made in (a neighbour
that started mid-baseline slows only its later turns): different tokens, or any of them more than DRIFT apart, and
the whole baseline is timed here instead. An entry an eval made while other work shared the device (`eyas eval
--timings-shared`, a recipe's eval beside training) is marked `shared` and its timings are never used by an eval
that times alone. A speedup is only ever divided by timings this process has confirmed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from eyas.decode.speculative import GenStats
from eyas.outputs import write_result

DRIFT = 0.25   # a cached turn timed more than this far (relative) from its re-timing here is not trusted
RETIMED = 3    # turns decoded again before a cached baseline's timings are used


def weights_sample(model: torch.nn.Module, per_tensor: int = 256) -> str:
    """sha256 over every tensor's name, shape, dtype and first `per_tensor` values: other weights, another hash."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        if t.numel():
            h.update(t.detach().flatten()[:per_tensor].float().cpu().numpy().tobytes())
    return h.hexdigest()


def cache_key(session, extra: dict) -> dict:
    """What the baseline of `session` (an evaluate.Session) depends on, as a JSON-able dict."""
    tok = session.target.tokenizer
    dev = session.device
    return {"weights": weights_sample(session.target.model), "dtype": str(session.runner.dtype),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type, "torch": torch.__version__,
            "capacity": session.capacity, "max_new_tokens": session.max_new, "temperature": session.temperature,
            "seed": session.seed, "eos": sorted(session.eos), "template": hashlib.sha256(
                str(getattr(tok, "chat_template", None)).encode() + str(len(tok)).encode()).hexdigest(),
            "questions": hashlib.sha256(json.dumps([[q["question_id"], q["turns"]] for q in session.questions],
                                                   ensure_ascii=False).encode()).hexdigest(), **extra}


def _path(root: Path, key: dict) -> Path:
    return root / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24] + ".json")


def load(root: Path, key: dict) -> tuple[dict[tuple, tuple[list[int], GenStats]], bool]:
    """The cached turns for `key` ({} when none, or when the file holds another key), and whether they were timed
    while other work shared the device."""
    p = _path(root, key)
    if not p.is_file():
        return {}, False
    doc = json.loads(p.read_text())
    if doc.get("key") != key:   # a hash collision or a hand-edited file: never reuse it
        return {}, False
    turns = {(t["question_id"], t["turn"]): (t["ids"], GenStats(**t["stats"])) for t in doc["turns"]}
    return turns, bool(doc.get("shared", False))


def save(root: Path, key: dict, baseline: dict[tuple, tuple[list[int], GenStats]], shared: bool = False) -> Path:
    """Write every turn of `baseline` atomically (two evals finishing at once: the last complete file wins; a full
    disk leaves the old file and no temp file). shared: some of its turns were timed beside other work."""
    root.mkdir(parents=True, exist_ok=True)
    turns = [{"question_id": q, "turn": t, "ids": ids, "stats": dataclasses.asdict(st)}
             for (q, t), (ids, st) in baseline.items()]
    return write_result(_path(root, key), json.dumps({"key": key, "shared": shared, "turns": turns}))


def rate(st: GenStats) -> float:
    return st.new_tokens / st.t_total if st.t_total else 0.0


def spread(keys: list, n: int) -> list:
    """n of `keys` evenly over their order (first and last included)."""
    if len(keys) <= n:
        return list(keys)
    return [keys[round(i * (len(keys) - 1) / (n - 1))] for i in range(n)] if n > 1 else [keys[0]]


def retime(cached: dict[tuple, tuple[list[int], GenStats]], generate, n: int | None = None) -> dict:
    """Decode n (default RETIMED) cached turns again (`generate(key) -> (ids, stats)`, in this process), spread over
    the order the cache made them in, and say whether the entry holds here: every turn the same tokens, and each
    rate within DRIFT of its cached one (one quiet turn cannot vouch for a baseline a neighbour slowed later)."""
    turns = []
    for key in spread(list(cached), n or RETIMED):
        ids, st = generate(key)
        then, now = rate(cached[key][1]), rate(st)
        turns.append({"question_id": key[0], "turn": key[1], "cached_tokens_per_s": round(then, 2),
                      "tokens_per_s_here": round(now, 2),
                      "apart": round(abs(now - then) / then, 4) if then else float("inf"),
                      "same_tokens": ids == cached[key][0]})
    apart, same = max(t["apart"] for t in turns), all(t["same_tokens"] for t in turns)
    return {"turns": turns, "apart": apart, "same_tokens": same, "used": same and apart <= DRIFT}

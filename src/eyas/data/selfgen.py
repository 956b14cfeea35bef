"""Self-generated prompts (Magpie-style): the target writes the user turn itself.

Feeding a chat model only its own template's user header ("<|im_start|>user\\n" after the default system
turn) makes it sample a plausible user message: prompts from the target's own idea of what users ask, for
users with no dataset, or for more data than the dataset holds. Each sample is cut at the template's
end-of-user marker and filtered (empty, too short, cut off, repetitive, template tokens, exact and near
duplicates); survivors are appended to a messages JSONL (one user turn per row) that `eyas regenerate`
then answers like any other source. The file is flushed per prompt, so a killed run resumes where it was.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np

_SENTINEL = "EYAS-SELF-PROMPT-SENTINEL"
PLACEHOLDER = "(not answered yet: `eyas regenerate` answers self-written prompts)"


def done_rows(out: Path) -> set[int]:
    """Rows already written. Only a torn last line (killed mid-write: no newline at its end) is cut off, so appends
    stay valid JSONL; any other line that is not a row is damage, refused with its line number and nothing cut."""
    if not out.is_file():
        return set()
    done, good, newline = set(), 0, True
    with open(out, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                done.add(int(row["row"]))
            except (ValueError, KeyError, TypeError, IndexError) as e:
                if line.endswith(b"\n"):
                    raise ValueError(f"{out}:{n}: not a written row ({type(e).__name__}: {str(e)[:80]}); nothing "
                                     f"was changed: repair or delete that line, or pass --overwrite to start "
                                     f"over") from None
                break                                 # the torn last line
            good += len(line)
            newline = line.endswith(b"\n")
    if good != out.stat().st_size or not newline:
        with open(out, "r+b") as f:
            f.truncate(good)
            if not newline:                           # a whole last row whose newline never came
                f.seek(good)
                f.write(b"\n")
    return done


def user_header(tok) -> tuple[str, str]:
    """(text before the user's content, the end-of-user marker) from the tokenizer's own chat template."""
    text = tok.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                   add_generation_prompt=False)
    if _SENTINEL not in text:
        raise ValueError("self-generated prompts: the chat template drops the user's content; use a dataset")
    head, tail = text.split(_SENTINEL, 1)
    end = tail.strip().split("\n", 1)[0].strip() if tail.strip() else ""
    return head, end


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


class PromptFilter:
    """Rejects degenerate and duplicate prompts; `check` returns a reason, or None and remembers the prompt.

    Near duplicates: MinHash over word 3-shingles with LSH banding (8 bands x 4 rows), candidates confirmed
    by exact Jaccard >= `near`; cheap enough for 10^5 prompts, unlike all-pairs comparison.
    """

    def __init__(self, specials: list[str], *, min_words: int = 3, min_chars: int = 12, near: float = 0.7,
                 seed: int = 0):
        self.specials = [s for s in specials if s]
        self.min_words, self.min_chars, self.near = min_words, min_chars, near
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, 2**31 - 1, 32, dtype=np.int64)
        self.b = rng.integers(0, 2**31 - 1, 32, dtype=np.int64)
        self.exact: set[str] = set()
        self.bands: dict[tuple, list[int]] = {}
        self.shingles: list[frozenset] = []

    def _shingles(self, norm: str) -> frozenset:
        w = norm.split()
        return frozenset(" ".join(w[i:i + 3]) for i in range(max(1, len(w) - 2)))

    def check(self, text: str, finish: str = "stop") -> str | None:
        t = text.strip()
        if not t:
            return "empty"
        if finish == "length":
            return "cut_off"
        if any(s in t for s in self.specials):
            return "template_tokens"
        words = t.split()
        if len(words) < self.min_words or len(t) < self.min_chars:
            return "too_short"
        raw = t.encode()
        if (len(words) >= 12 and len(set(words)) / len(words) < 0.35) or \
                (len(raw) >= 200 and len(zlib.compress(raw)) / len(raw) < 0.2):
            return "repetitive"
        norm = _norm(t)
        if norm in self.exact:
            return "duplicate"
        sh = self._shingles(norm)
        h = np.array([zlib.crc32(s.encode()) for s in sh], dtype=np.int64)
        sig = ((self.a[:, None] * h[None, :] + self.b[:, None]) % 2147483647).min(1)
        keys = [(i, tuple(sig[4 * i:4 * i + 4].tolist())) for i in range(8)]
        for k in keys:
            for j in self.bands.get(k, ()):
                other = self.shingles[j]
                if len(sh & other) / len(sh | other) >= self.near:
                    return "near_duplicate"
        self.exact.add(norm)
        for k in keys:
            self.bands.setdefault(k, []).append(len(self.shingles))
        self.shingles.append(sh)
        return None


def self_prompts(backend, n: int, path: Path, *, max_new_tokens: int = 128, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, max_attempts: int | None = None, log=print) -> dict:
    """Grow `path` to n accepted prompts (rows 0..n-1), sampling from the target loaded in `backend`."""
    from eyas.data.generate import Generator

    tok = backend.tok
    head, end = user_header(tok)
    ids = tok(head, add_special_tokens=False)["input_ids"]
    specials = list(getattr(tok, "all_special_tokens", []) or []) + [end, _SENTINEL]
    filt = PromptFilter(specials, seed=seed)
    done_rows(path)  # cuts a torn last line (killed mid-write) so appends stay valid JSONL
    have = 0
    if path.is_file():  # resume: the accepted prompts so far seed the duplicate filter
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    filt.check(json.loads(line)["messages"][0]["content"])
                    have += 1
                except (ValueError, KeyError, IndexError, TypeError):
                    break
    stats = {"wanted": n, "had": have, "accepted": 0, "attempts": 0, "rejected": {}}
    if have >= n:
        return stats
    gen = getattr(backend, "gen", None) or Generator(
        backend.model, batch_size=backend.batch_size, capacity=len(ids) + max_new_tokens + 1, eos=backend.eos,
        pad=backend.pad)
    gen.rng.manual_seed(seed + 7919 * have)  # a resumed run must not resample the prompts it already has
    stop = set(backend.eos)
    end_ids = tok(end, add_special_tokens=False)["input_ids"] if end else []
    if len(end_ids) == 1:
        stop.add(end_ids[0])
    budget = max_attempts or 8 * n
    state = {"inflight": 0, "row": have}
    with open(path, "a", encoding="utf-8") as f:
        def next_request():
            if state["row"] + state["inflight"] >= n or stats["attempts"] >= budget:
                return None
            stats["attempts"] += 1
            state["inflight"] += 1
            return stats["attempts"], ids, max_new_tokens

        def on_finish(_, tokens, reason):
            state["inflight"] -= 1
            text = tok.decode(tokens, skip_special_tokens=False)
            if end and end in text:
                text, reason = text.split(end, 1)[0], "stop"
            why = "error" if reason.startswith("error") else filt.check(text, reason)
            if why is None and state["row"] < n:
                # the placeholder answer makes the row a valid conversation; regenerate replaces it
                f.write(json.dumps({"row": state["row"], "source": "self",
                                    "messages": [{"role": "user", "content": text.strip()},
                                                 {"role": "assistant", "content": PLACEHOLDER}]},
                                   ensure_ascii=False) + "\n")
                f.flush()
                state["row"] += 1
                stats["accepted"] += 1
            elif why is not None:
                stats["rejected"][why] = stats["rejected"].get(why, 0) + 1

        gen.run(next_request, on_finish, temperature=temperature, top_p=top_p, eos=sorted(stop))
    log(f"self prompts: {stats['accepted']} new ({have} before, {n} wanted) from {stats['attempts']} samples; "
        f"rejected {stats['rejected']}")
    if state["row"] < n:
        log(f"self prompts: only {state['row']} of {n} after {budget} samples; raise the attempt budget or lower N")
    return stats

"""Template-agnostic assistant loss masks.

The target's own chat template renders the conversation. Where each assistant turn starts and ends is learnt
from the template itself, by incremental rendering: the render of the turns before it with the generation
prompt ends exactly where the assistant's content begins, and the render through the turn ends where the next
turn begins. Inside that segment we mask the content and the turn's end-of-turn token (the first added/special
token after the content, e.g. <|im_end|>, <|eot_id|>, <end_of_turn>), never headers, system or user text.

Every row is then validated: the decoded masked tokens of each turn must equal the turn's content up to
whitespace. Anything the method cannot explain (a template that rewrites earlier turns, content it alters,
tokens straddling the content boundary, unknown-token fallbacks) raises `MaskError` with the reason, so a
row is rejected rather than kept with a wrong mask. loss_mask[i] = 1 iff token i is an assistant token;
there is no shift here (the trainer shifts).
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
import torch


class MaskError(ValueError):
    """A conversation whose loss mask cannot be derived or verified; the message starts with 'category: '."""


def template_of(tokenizer, override: str | None = None) -> str:
    tpl = override or getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("default") or next(iter(tpl.values()), None)
    if not tpl:
        raise MaskError("template_missing: the tokenizer has no chat template (pass --chat-template FILE)")
    return tpl


def template_hash(tokenizer, override: str | None = None) -> str:
    return hashlib.sha256(template_of(tokenizer, override).encode()).hexdigest()


class ChatRenderer:
    """A tokenizer plus its compiled chat template; renders text and derives masks for batches of chats."""

    def __init__(self, tokenizer, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.template = template_of(tokenizer, chat_template)
        self._kw = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
        try:  # the compiled template is ~2x faster than apply_chat_template; the private name may move
            from transformers.utils.chat_template_utils import _compile_jinja_template
            self._compiled = _compile_jinja_template(self.template)
        except Exception:  # noqa: BLE001 - fall back to the public API
            self._compiled = None
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        # Atomic marker tokens: any of them directly after the content is the turn's end-of-turn token.
        self.marker_ids = set(int(i) for i in added) | set(getattr(tokenizer, "all_special_ids", []) or [])
        self.marker_arr = np.asarray(sorted(self.marker_ids), dtype=np.int64)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        try:
            if self._compiled is not None:
                # tools/documents passed as None like transformers does, so `tools is not none` tests agree
                return self._compiled.render(messages=list(messages), tools=None, documents=None,
                                             add_generation_prompt=add_generation_prompt, **self._kw)
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      chat_template=self.template)
        except Exception as e:  # noqa: BLE001 - templates raise anything (raise_exception, TypeError, ...)
            msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise MaskError(f"template_error: the chat template refused this conversation: {msg}") from None

    def spans(self, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int, int, int]]]:
        """Full text and, per assistant turn, (content_start, content_end, turn_end, message index) in chars."""
        full = self.render(messages)
        out = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            pre = self.render(messages[:i], add_generation_prompt=True)
            thru = full if i == len(messages) - 1 else self.render(messages[: i + 1])
            if not (full.startswith(pre) and full.startswith(thru) and len(pre) <= len(thru)):
                raise MaskError(f"template_unstable: rendering turn {i} changes earlier text (the template "
                                f"rewrites history), so turn boundaries cannot be located")
            seg = full[len(pre):len(thru)]
            content = m["content"].strip()
            k = seg.find(content)
            if k < 0:
                raise MaskError(f"content_not_found: the template does not reproduce assistant turn {i} verbatim")
            out.append((len(pre) + k, len(pre) + k + len(content), len(thru), i))
        if not out:
            raise MaskError("no_assistant: conversation has no assistant turn")
        return full, out

    def masks(self, conversations: Sequence[Sequence[dict]]) -> list[tuple[np.ndarray, np.ndarray] | MaskError]:
        """(input_ids int64, loss_mask bool) or the MaskError, per conversation; one batched tokenizer call."""
        results: list[Any] = [None] * len(conversations)
        texts, where = [], []
        for j, msgs in enumerate(conversations):
            try:
                full, spans = self.spans(msgs)
            except MaskError as e:
                results[j] = e
                continue
            texts.append(full)
            where.append((j, spans, msgs))
        if not texts:
            return results
        for (j, spans, msgs), view, text in zip(where, self._encode(texts), texts):
            try:
                results[j] = self._mask_one(view, spans, msgs, text)
            except MaskError as e:
                results[j] = e
        return results

    def _encode(self, texts: list[str]) -> list["_Offsets | _Encoding"]:
        if self.backend is not None:  # the Rust tokenizer directly: no per-token Python conversion
            return [_Encoding(e) for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        try:
            enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:
            raise MaskError("tokenizer_unsupported: the tokenizer gives no character offsets (use a fast "
                            "tokenizer)") from None
        return [_Offsets(ids, offs) for ids, offs in zip(enc["input_ids"], enc["offset_mapping"])]

    def _decode(self, ids: np.ndarray) -> str:
        if self.backend is not None:
            return self.backend.decode(ids.tolist(), skip_special_tokens=False)
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _mask_one(self, view: "_Offsets | _Encoding", spans, msgs, text: str):
        ids = view.ids
        mask = np.zeros(len(ids), dtype=bool)
        for cs, ce, te, i in spans:
            # content tokens: every token overlapping the content's characters
            found = view.locate(cs, ce)
            if found is None:
                raise MaskError(f"mask_mismatch: assistant turn {i} has no tokens")
            lo, hi = found
            got = self._decode(ids[lo:hi])
            if " ".join(got.split()) != " ".join(msgs[i]["content"].split()):
                raise MaskError(f"mask_mismatch: decoded tokens of assistant turn {i} differ from its content "
                                f"({got[:40]!r}... vs {msgs[i]['content'][:40]!r}...): unknown characters or a "
                                f"token straddling the turn boundary")
            first = view.chars(lo)[0]
            if first < cs and text[first:cs].strip():
                raise MaskError(f"mask_mismatch: first token of assistant turn {i} also covers template text")
            if np.isin(ids[lo:hi], self.marker_arr).any():
                raise MaskError(f"special_token_in_content: assistant turn {i} contains a template/special token "
                                f"string, which would teach the draft to end turns early")
            mask[lo:hi] = True
            # end-of-turn: whitespace tokens then the first marker token, inside this turn's own text
            k = hi
            while k < len(ids):
                start, end = view.chars(k)
                if start >= te:
                    break
                if int(ids[k]) in self.marker_ids:
                    mask[hi:k + 1] = True
                    break
                if text[start:end].strip():
                    break  # textual turn end: the content alone is learnt
                k += 1
        return ids, mask


class _Encoding:
    """Token view over a `tokenizers.Encoding`: char->token lookups done in Rust."""

    def __init__(self, enc):
        self.enc = enc
        self.ids = np.asarray(enc.ids, dtype=np.int64)
        self._fallback: _Offsets | None = None

    def locate(self, cs: int, ce: int) -> tuple[int, int] | None:
        a, b = self.enc.char_to_token(cs), self.enc.char_to_token(ce - 1)
        if a is None or b is None:  # a character no token covers (normalizer/trimmed offsets): scan offsets
            if self._fallback is None:
                self._fallback = _Offsets(self.enc.ids, self.enc.offsets)
            return self._fallback.locate(cs, ce)
        # a character split over several byte-level tokens maps to one of them: widen to all overlapping tokens
        while a > 0 and self.chars(a - 1)[1] > cs:
            a -= 1
        while b + 1 < len(self.ids) and self.chars(b + 1)[0] < ce:
            b += 1
        return a, b + 1

    def chars(self, k: int) -> tuple[int, int]:
        span = self.enc.token_to_chars(k) if self._fallback is None else None
        if span is None:  # token_to_chars has no answer (or we already hold the offsets)
            if self._fallback is None:
                self._fallback = _Offsets(self.enc.ids, self.enc.offsets)
            return self._fallback.chars(k)
        return int(span[0]), int(span[1])


class _Offsets:
    """Token view over ids + an offset mapping (any tokenizer that returns offsets)."""

    def __init__(self, ids, offsets):
        self.ids = np.asarray(ids, dtype=np.int64)
        offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        self.starts, self.ends = offs[:, 0], offs[:, 1]

    def locate(self, cs: int, ce: int) -> tuple[int, int] | None:
        inside = np.nonzero((self.starts < ce) & (self.ends > cs))[0]
        return (int(inside[0]), int(inside[-1]) + 1) if len(inside) else None

    def chars(self, k: int) -> tuple[int, int]:
        return int(self.starts[k]), int(self.ends[k])


def render_with_mask(tokenizer, messages: Sequence[dict], chat_template: str | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids LongTensor [T], loss_mask BoolTensor [T]) of one conversation; raises MaskError with the reason."""
    res = ChatRenderer(tokenizer, chat_template).masks([list(messages)])[0]
    if isinstance(res, MaskError):
        raise res
    ids, mask = res
    return torch.from_numpy(ids), torch.from_numpy(mask)


def render_text(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Plain-text rows: the tokenizer's own special tokens, every token a training target."""
    ids = np.asarray(tokenizer(text, add_special_tokens=True)["input_ids"], dtype=np.int64)
    return ids, np.ones(len(ids), dtype=bool)

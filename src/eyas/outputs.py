"""Owner of every command's output: one rule for prepare, regenerate, extract, train, eval --out, export,
import, demo and serve-check --out.

  - `--out` is resolved (symlinks followed) before anything is decided, so a link cannot aim a write at an input;
  - an output is never one of the command's inputs (the target, --data, --draft, ...) nor a directory holding
    one, whatever the flags;
  - an existing output that is this command's own work is resumed (resumable kinds: the settings and input
    identities it recorded must match) or replaced (the other kinds, whose writers replace atomically);
    anything else is refused unless --overwrite, and --overwrite deletes only what an eyas output holds: an
    unknown file in the way is named and nothing is deleted;
  - one writer per output: an exclusive lock beside it (`.NAME.lock`), which the kernel drops when the process
    dies, so a kill never leaves a lock that needs a hand;
  - a resumable output records what it was started with (`eyas-output.json` in a directory, NAME.eyas-output.json
    beside a file): the settings that decide its content and its inputs' identities (`input_id`).
Pure Python (no torch): the CLI and every stage may import it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eyas import __version__
from eyas.config import ConfigError

RECORD = "eyas-output.json"
_HIDDEN = re.compile(r"\..*\.lock|" + re.escape(RECORD))   # our locks and records: never a reason to refuse


class OutputError(ConfigError):
    """An output that cannot be written as asked; the message names the path and the way out."""


# ---------------------------------------------------------------- what each command writes
def _json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _doc(p: Path, name: str) -> dict:
    d = _json(p / name)
    return d if isinstance(d, dict) else {}


def _first_row(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as f:
            row = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and "row" in row and "messages" in row


def _result(*keys: str) -> Callable[[Path], bool]:
    def recognise(p: Path) -> bool:
        d = _json(p)
        return isinstance(d, dict) and any(k in d for k in keys)
    return recognise


@dataclass(frozen=True)
class Kind:
    what: str                          # "a training run" (in messages)
    is_dir: bool
    resumable: bool                    # own work is continued (its record must match), else it is replaced
    entries: str                       # regex: the names a directory of this kind holds
    recognise: Callable[[Path], bool]  # an output of this kind made before records existed
    work: str = ""                     # regex: entries that hold work worth keeping (default: any entry)
    sidecars: tuple[str, ...] = ()     # a file output's companions: OUT + suffix


_TMP = r"(\.tmp|\.\w*tmp\w*)?"
KINDS: dict[str, Kind] = {
    "prepared": Kind("a prepared dataset", True, True,
                     rf"(manifest\.json|vocab\.safetensors|rejects\.jsonl|rows-\d+\.safetensors){_TMP}",
                     lambda p: _doc(p, "manifest.json").get("format") == "eyas-prepared", work=r"manifest\.json"),
    "store": Kind("a hidden-state store", True, True,
                  rf"(manifest\.json|rank-\d+\.json|shard-\d+\.safetensors)(\..*\.?tmp|\.tmp)?|\.lock-.*|"
                  r"\.vllm-states|vllm-extract\.log",
                  lambda p: _doc(p, "manifest.json").get("format") == "eyas-store" or any(p.glob("rank-*.json"))
                  or any(p.glob("shard-*.safetensors"))),
    "run": Kind("a training run", True, True,
                rf"checkpoints|metrics\.jsonl|tb|train_config\.yaml|config\.json|model\.safetensors{_TMP}|"
                r"stand-in\.jsonl|prepared|run",
                lambda p: (p / "checkpoints").is_dir() or (p / "metrics.jsonl").is_file()
                or "train" in _doc(p, "config.json"), work=r"checkpoints|metrics\.jsonl"),
    "draft": Kind("an imported draft", True, False, rf"config\.json|model\.safetensors{_TMP}",
                  lambda p: "imported_from" in _doc(p, "config.json")),
    "export": Kind("an eyas export", True, False, r"config\.json|model\.safetensors|README\.md",
                   lambda p: "eyas" in _doc(p, "config.json") and _doc(p, "config.json").get("format") != "eyas-draft"),
    "demo": Kind("an eyas demo", True, False,
                 r"regenerated|prepared|store|run|eval|export|train-warm|eval-warm|summary\.json|report\.md|"
                 r"learning_curve\.png|\.write-test|state\.json(\.tmp)?|[\w.:-]+\.log",
                 lambda p: (p / "summary.json").is_file() or (p / "regenerated").is_dir()
                 or ((p / "prepared").is_dir() and (p / "run").is_dir())),
    "regenerate": Kind("regenerated conversations", False, True, "", _first_row,
                       sidecars=(".errors.jsonl", ".self-prompts.jsonl", ".task-prompts.jsonl",
                                 ".task-prompts.jsonl.tmp", ".vllm.log")),
    "eval": Kind("eval results", False, False, "", _result("results", "warm_only")),
    "serve-check": Kind("serve-check results", False, False, "", _result("served_tau", "native_tau", "export"),
                        sidecars=(".engine.log",)),
}


# ---------------------------------------------------------------- identities of inputs
_SAMPLES, _BLOCK = 16, 1 << 16     # a big file is known by its size and 16 blocks of 64 KiB spread over it


def file_digest(path: Path) -> str:
    """sha256 of a file's size and content: all of it up to 1 MiB, else 16 blocks spread over it (weights and
    shards differ everywhere when they differ at all; a GB file is read in 1 MiB)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _SAMPLES * _BLOCK:
            h.update(f.read())
        else:
            for i in range(_SAMPLES):
                f.seek((size - _BLOCK) * i // (_SAMPLES - 1))
                h.update(f.read(_BLOCK))
    return h.hexdigest()


def content_id(path: str | os.PathLike) -> str:
    """sha256 over what a file or directory holds. A directory with a manifest.json (prepared data, a store)
    is its manifest (which lists every shard's sha256); a built-in target eyas converted (its `.complete` record)
    is its source and converter version, since the files a conversion writes carry the converting machine's
    transformers version (config.json) and would make the same weights another input on every other stack; any
    other directory is every file's name and digest, leaving out hidden files, locks, temp files, records and docs
    (a README edit is not another model)."""
    p = Path(path)
    if p.is_file():
        return file_digest(p)
    if (p / "manifest.json").is_file():
        return hashlib.sha256((p / "manifest.json").read_bytes()).hexdigest()
    built = _json(p / ".complete")
    if isinstance(built, dict) and built.get("from"):
        src = {k: built.get(k) for k in ("from", "gguf", "converter")}
        return hashlib.sha256(json.dumps({"eyas-builtin": src}, sort_keys=True).encode()).hexdigest()
    return files_id(p)


def files_id(p: Path) -> str:
    """Every file's name and digest under directory P (content_id's rule for a directory without a manifest; what
    records named a built-in target by before it was known by its source)."""
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        rel = f.relative_to(p).as_posix()
        if any(part.startswith(".") for part in rel.split("/")) or rel.endswith((".lock", ".tmp", ".md", RECORD)):
            continue
        h.update(f"{rel}\0{file_digest(f)}\0".encode())
    return h.hexdigest()


def input_id(value: str | os.PathLike | None, *, cache: str | os.PathLike | None = None) -> dict[str, Any]:
    """What an input is: {"spec": as given, "sha256": its content} for a local file or directory (a built-in
    target: its converted directory once fetched); spec alone for anything else (a hub id, a built-in dataset)."""
    if value is None:
        return {"spec": None, "sha256": None}
    spec = str(value)
    p = Path(spec).expanduser()
    if not p.exists() and "/" not in spec:
        from eyas.cache import cache_dir    # a built-in target already converted (nothing is fetched here)
        built = cache_dir(cache) / "models" / spec
        p = built if (built / ".complete").is_file() else p
    try:
        out = {"spec": spec, "sha256": content_id(p) if p.exists() else None}
        if p.is_dir() and (p / ".complete").is_file():   # a record written before may name its files' digest
            out["files_sha256"] = files_id(p)
        return out
    except OSError as e:
        raise OutputError(f"{spec}: cannot read it to record its identity ({e.strerror or e})") from None


def same_input(a: dict | None, b: dict | None) -> bool:
    """Content when both sides know it (a moved copy is the same input), else the spec as given."""
    a, b = a or {}, b or {}
    if a.get("sha256") and b.get("sha256"):   # (or one names the other's files: a record older than the rule)
        return a["sha256"] == b["sha256"] or a["sha256"] == b.get("files_sha256") or \
            b["sha256"] == a.get("files_sha256")
    return a.get("spec") == b.get("spec")   # e.g. a built-in target fetched between the two


def _show(d: dict | None) -> str:
    d = d or {}
    return f"{d.get('spec')} (content {d['sha256'][:12]})" if d.get("sha256") else repr(d.get("spec"))


# ---------------------------------------------------------------- records
def record_path(out: str | os.PathLike, is_dir: bool | None = None) -> Path:
    p = Path(out)
    is_dir = p.is_dir() if is_dir is None else is_dir
    return p / RECORD if is_dir else p.with_name(p.name + "." + RECORD)


def read_record(out: str | os.PathLike, is_dir: bool | None = None) -> dict | None:
    """The record of an output (None when there is none, or it is not one)."""
    d = _json(record_path(out, is_dir))
    return d if isinstance(d, dict) and d.get("format") == "eyas-output" else None


def recorded_input(out: str | os.PathLike, name: str) -> dict | None:
    """The identity of input `name` an output was made from (None for an output made before records)."""
    rec = read_record(out)
    return (rec or {}).get("inputs", {}).get(name)


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, sort_keys=True, default=str))


def differences(old: dict, new: dict, defaults: dict[str, Any] | None = None) -> list[str]:
    """What differs between two records' settings and inputs, each as `--flag old (now new)`. A setting the old
    record lacks held its value in `defaults` then (a flag added since, left at its default, is no change)."""
    out = []
    a, b = {**_plain(defaults or {}), **(old.get("settings") or {})}, new.get("settings") or {}
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"--{k.replace('_', '-')} {a.get(k)!r} (now {b.get(k)!r})")
    a, b = old.get("inputs") or {}, new.get("inputs") or {}
    for k in sorted(set(a) | set(b)):
        if not same_input(a.get(k), b.get(k)):
            out.append(f"--{k.replace('_', '-')} {_show(a.get(k))} (now {_show(b.get(k))})")
    return out


def _atomic_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- the lock
class OutputLock:
    """An exclusive flock on a file (never followed through a symlink). wait=False: a second holder fails at once
    with `busy` as its message (as `error`). The kernel drops it when the process dies."""

    def __init__(self, path: Path, busy: str, *, wait: bool = False, error: type[Exception] = OutputError):
        self.path, self.busy, self.wait, self.error, self.fd = Path(path), busy, wait, error, None

    def __enter__(self) -> "OutputLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise self.error(self.busy) from None
        self.fd = fd
        return self

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.close(self.fd)           # closing drops the flock
            self.fd = None
        return False


def lock_path(out: Path, name: str = "") -> Path:
    """`.NAME.lock` beside the output: it survives the output being replaced (export renames a new dir in)."""
    return out.parent / f".{out.name}{'.' + name if name else ''}.lock"


# ---------------------------------------------------------------- the claim
@dataclass
class Claim:
    """A held output: `path` is the resolved place to write; `existing` says what was there ("free", "own");
    `created`: nothing was there before the claim (a stage that fails before writing leaves nothing either)."""
    path: Path
    kind: str
    existing: str
    record: dict | None
    lock: OutputLock | None
    created: bool = False

    def release(self, failed: bool = False) -> None:
        if failed and self.created:
            self._untouched_away()
        if self.lock is not None:
            self.lock.__exit__(None, None, None)
            self.lock = None

    def _untouched_away(self) -> None:
        """Remove what the claim itself made (the record, the directory) if the stage wrote nothing."""
        k = KINDS[self.kind]
        rec = record_path(self.path, k.is_dir)
        if k.is_dir and self.path.is_dir() and not _entries(self.path):
            rec.unlink(missing_ok=True)
            try:
                self.path.rmdir()
            except OSError:
                pass
        elif not k.is_dir and not os.path.lexists(self.path):
            rec.unlink(missing_ok=True)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        self.release(failed=exc_type is not None)
        return False


def _entries(p: Path) -> list[Path]:
    return sorted(e for e in p.iterdir() if not _HIDDEN.fullmatch(e.name))


def _known(name: str) -> bool:
    return any(k.is_dir and re.fullmatch(k.entries, name) for k in KINDS.values())


def inspect(path: Path, kind: str) -> tuple[str, str]:
    """(state, what): "free" (nothing there, or nothing worth keeping), "own" (this kind's work), "foreign"
    (something else: what names it), or "blocked" (it can never be this kind's output: what says why)."""
    k = KINDS[kind]
    if not os.path.lexists(path):
        return "free", ""
    if k.is_dir != path.is_dir():
        return "blocked", "a directory" if path.is_dir() else "a file, not a directory"
    if not k.is_dir:
        rec = read_record(path, False)
        if path.stat().st_size == 0:
            return "free", ""
        if rec is not None:
            return ("own", "") if rec.get("kind") == kind else ("foreign", KINDS.get(rec.get("kind"), k).what)
        return ("own", "") if k.recognise(path) else ("foreign", "a file eyas did not write")
    entries = _entries(path)
    if not entries:
        return "free", ""
    unknown = [e.name for e in entries if not re.fullmatch(k.entries, e.name)]
    rec = read_record(path, True)
    made_by = rec.get("kind") if rec is not None and rec.get("kind") in KINDS else None
    if made_by is None:   # made before records (or not by eyas): known by its files
        made_by = kind if k.recognise(path) else next(
            (n for n, o in KINDS.items() if o.is_dir and n != kind and o.recognise(path)),
            kind if not unknown else None)
    if made_by is not None and made_by != kind:
        return "foreign", KINDS[made_by].what
    if unknown:
        return "foreign", "other files (" + ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "") + ")"
    if k.work and not any(re.fullmatch(k.work, e.name) for e in entries):
        return "free", ""               # its own leftovers with nothing of value (a run killed before step 1)
    return "own", ""


def clear(path: Path, kind: str) -> None:
    """Delete an output to start over: a file and its sidecars; a directory's entries, only when every one is
    something an eyas output holds (else nothing is deleted and the unknown ones are named)."""
    k = KINDS[kind]
    if not os.path.lexists(path):
        return
    if not path.is_dir() or path.is_symlink():
        for p in [path, record_path(path, False)] + [path.with_name(path.name + s) for s in k.sidecars]:
            if os.path.lexists(p):
                p.unlink()
        return
    unknown = [e.name for e in _entries(path) if not _known(e.name)]
    if unknown:
        raise OutputError(f"--overwrite: {path} holds files no eyas output has ({', '.join(unknown[:5])}"
                          f"{' ...' if len(unknown) > 5 else ''}); nothing was deleted: choose another --out or "
                          f"remove them yourself")
    empty(path)
    record_path(path, True).unlink(missing_ok=True)


def empty(path: Path) -> None:
    """Delete a directory's entries, keeping its record and locks: a stage starting its claimed output over."""
    for e in _entries(path):
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()


def refuse_inputs(path: Path, given: Path, inputs: dict[str, Any]) -> None:
    """An output is never an input nor a directory holding one, whatever --overwrite says."""
    via = f" (it resolves to {path})" if given.absolute() != path else ""
    for name, value in inputs.items():
        if value is None:
            continue
        spec = str(value)
        q = Path(spec).expanduser()
        if not q.exists():
            continue
        q = q.resolve()
        if q == path or path in q.parents:
            rel = "is" if q == path else "holds"
            raise OutputError(f"--out {given}{via} {rel} the --{name.replace('_', '-')} {spec}: writing there would "
                              f"destroy an input (--overwrite never does); choose another --out")


def claim(out: str | os.PathLike, kind: str, *, overwrite: bool = False, resume: bool = True,
          inputs: dict[str, Any] | None = None, settings: dict[str, Any] | None = None, lock: str | None = "",
          cache: str | os.PathLike | None = None, defaults: dict[str, Any] | None = None) -> Claim:
    """Take `out` for a command writing `kind` (see the module doc for the rule). `inputs` (flag name -> path or
    spec) are protected, and identified in the record with `settings` (resumable kinds). `resume=False` (train
    without --resume) refuses this kind's own earlier work too unless `overwrite`. `lock=None`: the caller holds
    its own lock (the store's per-rank ones); a string names a second lock beside the output (a rank). `defaults`:
    what a setting an older record lacks held then."""
    k = KINDS[kind]
    given = Path(out).expanduser()
    path = given.resolve()
    created = not os.path.lexists(path)
    inputs = inputs or {}
    refuse_inputs(path, given, inputs)
    state, what = inspect(path, kind)
    _check_state(given, k, state, what, overwrite, resume)       # before any lock file is made
    path.parent.mkdir(parents=True, exist_ok=True)
    held = None
    if lock is not None:
        held = OutputLock(lock_path(path, lock), f"--out {given}: another eyas process is writing it "
                                                 f"({lock_path(path, lock).name} is locked); wait for it to finish, "
                                                 f"or choose another --out").__enter__()
    try:
        state, what = inspect(path, kind)                          # again, now that no one else writes it
        _check_state(given, k, state, what, overwrite, resume)
        record = None
        if settings is not None:
            record = {"format": "eyas-output", "kind": kind, "eyas_version": __version__,
                      "settings": _plain(settings),
                      "inputs": {n: input_id(v, cache=cache) for n, v in inputs.items()}}
        if state == "own" and k.resumable and not overwrite and record is not None:
            old = read_record(path, k.is_dir)
            diff = differences(old, record, defaults) if old is not None else []
            if diff:
                raise OutputError(f"--out {given} was started with other settings: {'; '.join(diff)}. Resume with "
                                  f"the same ones, or pass --overwrite to start over, or choose another --out")
        if overwrite and state in ("own", "foreign") and (k.resumable or state == "foreign"):
            clear(path, kind)
            state = "free"
        if k.is_dir and k.resumable:      # the others' writers make (or rename in) the directory themselves
            path.mkdir(parents=True, exist_ok=True)
        if record is not None:
            _atomic_json(record_path(path, k.is_dir), record)
        return Claim(path, kind, state, record, held, created)
    except BaseException:
        if held is not None:
            held.__exit__(None, None, None)
        raise


def _check_state(given: Path, k: Kind, state: str, what: str, overwrite: bool, resume: bool) -> None:
    if state == "blocked":
        raise OutputError(f"--out {given} is {what}; {k.what} goes in a {'directory' if k.is_dir else 'file'}: "
                          f"choose another --out")
    if state == "foreign" and not overwrite:
        raise OutputError(f"--out {given} already holds {what}, not {k.what}: pass --overwrite to replace it, "
                          f"or choose another --out")
    if state == "own" and k.resumable and not resume and not overwrite:
        raise OutputError(f"--out {given} already holds {k.what}: pass --resume to continue it, or --overwrite "
                          f"to delete it and start over, or choose a new --out")


def write_result(path: str | os.PathLike, text: str) -> Path:
    """A results file, complete or absent: written beside and renamed (a full disk leaves the old file, or
    none, and no temp file behind)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
    return p

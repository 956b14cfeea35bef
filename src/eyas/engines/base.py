"""The Engine interface every serving engine (vLLM, SGLang) implements, and the one way eyas talks to its env.

An engine lives in its own virtual environment (each pins its own torch); eyas runs a worker script there with
`python worker.py IN.json OUT.json` and reads the JSON it writes. Workers import only the engine and the
standard library (they run where eyas is not installed).

`Engine` is what serve-check, the served-speedup sweep (engines/speedup.py) and doctor call: the version and
entry-point probe; `serve`: greedy decoding of token-id prompts with a draft export drafting a chain or an
EAGLE-2 tree (eyas.decode.tree.TreeSpec), giving the outputs and the engine's own acceptance counters as
`SpecStats`; `generate`: the same without a draft; `bench_request`: one engine's AR or speculative timing run
(its worker's bench mode, serve_timing.py). `WorkerEngine` implements it over the engine's serve worker and
probe_worker.py; an engine adds its entry-point table, how it is configured (`engine_request`), how its counters
read (`spec_stats`) and how engines share a GPU (`share_memory`). Standard library only: the CLI imports
EngineError from here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, TypeVar

from eyas import env as switches
from eyas.engines.entry_points import (EntryPoint, ProbeResult, applicable, check_signatures, drafter_problems,
                                       version_status)

if TYPE_CHECKING:
    from eyas.decode.tree import TreeSpec

T = TypeVar("T")


class EngineError(RuntimeError):
    """An engine is missing, the wrong version, or its worker failed; the message says what to do."""


@dataclass
class SpecStats:
    """Acceptance from an engine's own counters: `steps` verification steps, `accepted` drafted tokens accepted,
    `accepted_at[j]` steps that accepted more than j drafted tokens. τ counts the bonus token, as eyas's does."""
    steps: int
    accepted: int
    accepted_at: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float | None:
        return 1.0 + self.accepted / self.steps if self.steps else None

    @property
    def accept_per_position(self) -> list[float]:
        return [a / self.steps for a in self.accepted_at] if self.steps else []

    def as_dict(self) -> dict:
        return {"drafts": self.steps, "tau": self.tau, "accept_per_position": self.accept_per_position}


@dataclass
class Served:
    """One serve / generate run: greedy outputs per prompt, the acceptance (None without a draft), timings, and
    what the engine says it ran (`config`: its own view of the speculative settings)."""
    outputs: list[list[int]]
    stats: SpecStats | None
    version: str | None
    startup_s: float
    generate_s: float
    config: dict | None = None
    logprobs: list | None = None      # per prompt, per generated token: [[token id, logprob], ...] best first


class Engine(Protocol):
    name: str                 # "vllm" | "sglang"
    label: str                # "vLLM" | "SGLang"
    export_format: str        # the `eyas export --format` it serves
    trees: bool               # serves topk > 1 (vLLM removed tree drafting; SGLang keeps it)
    starts_one_at_a_time: bool  # engines sharing a GPU must not load side by side (the speedup sweep's waves)
    python: Path              # its environment's interpreter
    worker: Path              # its serve worker script (serve, generate, bench mode)

    def version(self) -> str | None: ...

    def probe(self, used_by: str | None = None) -> list[ProbeResult]: ...

    def serve(self, target: str, export: str | os.PathLike, prompts: list[list[int]], max_new_tokens: int,
              spec: TreeSpec | None = None, **options) -> Served: ...

    def generate(self, target: str, prompts: list[list[int]], max_new_tokens: int, **options) -> Served: ...

    def bench_request(self, target: str, export: str | None, spec: TreeSpec | None, **options) -> dict: ...

    def spec_stats(self, counters: dict) -> SpecStats: ...

    def share_memory(self, jobs: dict[str, str | None], target: str, engines_per_gpu: int, batch: int,
                     max_model_len: int, dtype: str) -> dict[str, dict]: ...

    def env(self) -> dict[str, str]: ...

    def lock(self): ...


def engine_python(python: str | os.PathLike | None, env_var: str, how_to: str) -> Path:
    """The interpreter of the engine's environment: --python, else $ENV_VAR; else an error saying how."""
    cand = python or switches.get(env_var)
    if not cand:
        raise EngineError(f"no engine environment given: pass --python PATH or set ${env_var}.\n{how_to}")
    p = Path(cand).expanduser()
    if p.is_dir():
        p = p / "bin" / "python"
    if not p.exists():
        found = shutil.which(str(cand))
        if not found:
            raise EngineError(f"engine python {cand} does not exist.\n{how_to}")
        p = Path(found)
    return p


def run_in_env(python: Path, worker: Path, payload: dict[str, Any], *, timeout: float | None = None,
               env: dict[str, str] | None = None, log: Path | None = None) -> dict[str, Any]:
    """Run `worker` under `python` with `payload`; return the JSON it wrote. Its stdout/stderr go to
    `log` as they are written (or are kept for the error message) so an engine crash is reported, not swallowed.
    The worker runs in its own session: on a timeout (or any interruption) it is killed with everything it
    started (an engine's core process would otherwise stay, holding the GPU), and so is what outlives its exit."""
    with tempfile.TemporaryDirectory(prefix="eyas-engine-") as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(payload))
        run_env = {**os.environ, "PYTHONUNBUFFERED": "1", **HANG_ENV, **(env or {})}
        run_env.pop("PYTHONPATH", None)  # the engine env must not see eyas's site-packages
        sink = open(log, "w") if log else subprocess.PIPE
        # -P: the worker's own folder (eyas/engines, which holds vllm.py) must not shadow the engine package.
        proc = subprocess.Popen([str(python), "-P", str(worker), str(inp), str(out)], stdout=sink,
                                stderr=subprocess.STDOUT, text=True, env=run_env, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            where = report_hang(proc, sink if log else None)
            kill_group(proc)
            proc.communicate()
            tail = Path(log).read_text()[-2000:] if log else ""
            raise EngineError(f"{worker.name} did not finish within {timeout:.0f}s; {where}" + (
                f"; log {log}, last lines:\n{tail}" if log else "")) from e
        except BaseException:
            kill_group(proc)
            proc.wait()
            raise
        finally:
            kill_group(proc)
            if log:
                sink.close()
        if proc.returncode != 0 or not out.exists():
            tail = (Path(log).read_text()[-4000:] if log else (output or "")[-4000:])
            raise EngineError(f"{worker.name} failed (exit {proc.returncode}) under {python}:\n{tail}")
        return json.loads(out.read_text())


# Every engine worker runs with faulthandler on: SIGABRT then prints each Python thread's stack to the process's
# stderr (the worker's log), even in a process blocked in C code, so a start-up that hangs says where.
HANG_ENV = {"PYTHONFAULTHANDLER": "1"}


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process in session `sid` (a worker started with start_new_session and all it
    started there: the engine core, compiler and JIT processes), read from /proc; [] where there is no /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == sid:
                cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(stat.parent.name), cmd.strip()[:200]))
        except (OSError, IndexError, ValueError):   # a process that ended meanwhile
            continue
    return sorted(found)


def report_hang(proc: subprocess.Popen, sink=None, wait_s: float = 5.0) -> str:
    """A worker outlived its bound: write its session's processes to `sink` (its log), then SIGABRT each so
    faulthandler (HANG_ENV) appends its Python stacks, and wait up to `wait_s` for the worker to end. Returns
    one line for the error message: how many processes, and the names of any compiler or JIT build among them
    (a silent nvcc / ninja build is the usual start-up that looks hung). The caller kills what is left."""
    procs = session_processes(proc.pid)
    if sink is not None:
        sink.write("\n[eyas] the worker outlived its bound; its processes:\n"
                   + "".join(f"[eyas]   {pid} {cmd}\n" for pid, cmd in procs)
                   + "[eyas] SIGABRT to each: the Python stacks below (faulthandler)\n")
        sink.flush()
    for pid, _ in sorted(procs, reverse=True):   # one at a time, the engine's processes before the worker,
        try:                                       # so the stacks do not interleave in the shared log
            if hasattr(resource, "prlimit"):       # the stack, not a core file of a process holding a GPU
                resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            os.kill(pid, signal.SIGABRT)
        except (ProcessLookupError, PermissionError):
            continue
        time.sleep(min(0.5, wait_s / max(1, len(procs))))
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass
    builds = sorted({Path(cmd.split()[0]).name for _, cmd in procs if cmd}
                    & {"nvcc", "cicc", "ptxas", "ninja", "gcc", "g++", "cc", "c++", "cmake", "ld"})
    return (f"{len(procs)} process(es) in its session" + (f", building: {', '.join(builds)}" if builds else "")
            + (", their stacks in the log" if sink is not None else ""))


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a worker started in its own session and everything it started there (vLLM's engine core, compile
    workers), which would otherwise outlive it holding the GPU; a group already gone is left alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def engine_lock(name: str):
    """One real engine of a kind at a time on a shared machine (`flock /tmp/eyas-NAME.lock` takes the same)."""
    with open(f"/tmp/eyas-{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def start_twice(start: Callable[[], T], transient: tuple[str, ...], label: str, wait_s: float) -> T:
    """start(), and once more (after wait_s) if it raised an EngineError naming one of `transient`: start-up
    failures that a neighbour on the GPU causes and a second start does not meet."""
    try:
        return start()
    except EngineError as e:
        seen = next((m for m in transient if m in str(e)), None)
        if seen is None:
            raise
        warnings.warn(f"{label} failed to start ({seen!r}: a neighbour on the GPU freed memory while it measured); "
                      f"starting it once more in {wait_s:.0f} s", RuntimeWarning, stacklevel=3)
    time.sleep(wait_s)
    return start()


class WorkerEngine(ABC):
    """`Engine` over two worker scripts in the engine's env: probe_worker.py (version, signatures) and the
    engine's serve worker (serve, generate, bench mode). A subclass sets the class attributes and
    `engine_request` (the worker's `engine` section) and `spec_stats` (its counters -> SpecStats)."""

    name: ClassVar[str]
    label: ClassVar[str]                          # as its users spell it: vLLM, SGLang
    module: ClassVar[str]                         # the import that proves the engine is there
    distributions: ClassVar[tuple[str, ...]]      # pip names that install it
    env_var: ClassVar[str]                        # the switch naming its python (eyas.env)
    how_to_create: ClassVar[str]
    tested_versions: ClassVar[tuple[str, ...]]
    entry_points: tuple[EntryPoint, ...]          # the class's: all (the recorder's); an instance's: its target's
    # start-up failures that a neighbour on the GPU causes and a second start does not meet: `_run` retries once
    transient_start_errors: ClassVar[tuple[str, ...]] = ()
    retry_wait_s: ClassVar[float] = 10.0
    served_layers: ClassVar[dict[str, str]] = {}  # wrapper architecture -> where the engine keeps its decoder layers
    drafter_since: ClassVar[dict[str, tuple[str, str]]] = {}   # kind -> (first release serving eyas's export, why)
    worker: ClassVar[Path]                        # its serve worker
    export_format: ClassVar[str]
    dtypes: ClassVar[tuple[str, ...]] = ("fp32", "bf16")   # what its kernels run; the first is serve-check's default
    trees: ClassVar[bool]

    def __init__(self, python: str | os.PathLike | None = None, architectures=(), drafters=()):
        """`architectures`: the target's (config.architectures); `drafters`: the draft kinds served (eagle3,
        p-eagle, dflash). Entry points only such a target or drafter needs are probed for it alone."""
        self.python = engine_python(python, self.env_var, self.how_to_create)
        self.entry_points = applicable(type(self).entry_points, architectures, drafters)
        self.drafters = tuple(drafters or ())
        self._report: dict[str, Any] | None = None

    # ---- version and entry points
    def _run_probe(self, entry_points, *, do_import: bool, timeout: float) -> dict[str, Any]:
        payload = {"engine": self.module, "distributions": list(self.distributions), "import": do_import,
                   "entry_points": [{"name": ep.name, "module": ep.module, "qualname": ep.qualname, "kind": ep.kind}
                                    for ep in entry_points]}
        rep = run_in_env(self.python, Path(__file__).with_name("probe_worker.py"), payload, timeout=timeout,
                         env={**self.env(), "VLLM_LOGGING_LEVEL": "ERROR"})
        if rep.get("import_error"):
            raise EngineError(f"`import {self.module}` failed under {self.python}: {rep['import_error']}\n"
                              f"{self.how_to_create}")
        return rep

    def _probe_report(self, timeout: float = 600.0) -> dict[str, Any]:
        """One worker run gives version + every signature (importing the engine is the slow part: once)."""
        if self._report is None:
            self._report = self._run_probe(self.entry_points, do_import=True, timeout=timeout)
        return self._report

    def version(self) -> str | None:
        """The installed version from package metadata (about a second: the engine itself is not imported)."""
        if self._report is not None:
            return self._report.get("version")
        return self._run_probe((), do_import=False, timeout=120).get("version")

    def version_status(self, version: str | None) -> tuple[str, str]:
        return version_status(version, self.tested_versions, self.label)

    def drafter_problems(self, version: str | None) -> list[str]:
        """The served drafter kinds this version takes with the right signatures but another meaning."""
        return drafter_problems(version, self.drafters, self.drafter_since)

    def probe(self, used_by: str | None = None) -> list[ProbeResult]:
        """Every entry point's verdict; `used_by="extraction"` (or "serve-check") keeps one caller's."""
        eps = [ep for ep in self.entry_points if used_by is None or used_by in ep.used_by]
        return check_signatures(self._probe_report()["signatures"], eps)

    def timings(self) -> dict[str, float]:
        rep = self._probe_report()
        return {"import_s": rep.get("import_s"), "probe_s": rep.get("probe_s")}

    # ---- serving
    def lock(self):
        return engine_lock(self.name)

    def env(self) -> dict[str, str]:
        """Environment variables every worker run of this engine gets."""
        return {}

    @abstractmethod
    def share_memory(self, jobs: dict[str, str | None], target: str, engines_per_gpu: int, batch: int,
                     max_model_len: int, dtype: str) -> dict[str, dict]:
        """Memory settings ({job: engine_request options}) for `engines_per_gpu` engines sharing a GPU."""

    @abstractmethod
    def engine_request(self, target: str, export: str | None, spec: TreeSpec | None, *, dtype: str,
                       max_model_len: int, **options) -> dict:
        """The worker's `engine` section: how this engine is built to serve `export` (or the target alone)."""

    @abstractmethod
    def spec_stats(self, counters: dict) -> SpecStats:
        """τ and per-position acceptance from the engine's own counters of one run."""

    def bench_request(self, target: str, export: str | None, spec: TreeSpec | None, **options) -> dict:
        """The worker's `engine` section for one timing engine: the plain target (export None) or a draft."""
        return self.engine_request(target, export, spec, **options)

    def _run(self, engine: dict, prompts, max_new_tokens, *, logprobs: int = 0, timeout: float | None = None,
             log: Path | None = None, env: dict | None = None, stop_ids=None) -> Served:
        """One worker run. `stop_ids`: the only ids that end generation (eyas.target.special's, the ones eyas's own
        decoding stops on), rather than whatever the engine's tokenizer calls eos; None: the engine's own."""
        payload = {"engine": engine, "prompts": prompts, "max_tokens": max_new_tokens, "logprobs": logprobs}
        if stop_ids is not None:
            payload["stop_token_ids"] = [int(i) for i in stop_ids]
        doc = start_twice(lambda: run_in_env(self.python, self.worker, payload, timeout=timeout, log=log,
                                             env={**self.env(), **(env or {})}),
                          self.transient_start_errors, self.label, self.retry_wait_s)
        spec = engine.get("draft") is not None
        return Served(outputs=doc["outputs"], stats=self.spec_stats(doc["counters"]) if spec else None,
                      version=doc.get("version"), startup_s=doc["startup_s"], generate_s=doc["generate_s"],
                      config=doc.get("speculative_config"), logprobs=doc.get("logprobs"))

    def serve(self, target: str, export: str | os.PathLike, prompts: list[list[int]], max_new_tokens: int,
              spec: TreeSpec | None = None, *, dtype: str = "fp32", max_model_len: int = 2048,
              logprobs: int = 0, timeout: float | None = None, log: Path | None = None, stop_ids=None,
              **options) -> Served:
        """Greedy decoding of `prompts` with the draft export `export` drafting `spec` (None: the export's own
        setting, where the engine reads one from it), stopping on `stop_ids` (see _run). Raises EngineError when
        no drafting happened."""
        engine = self.engine_request(target, str(export), spec, dtype=dtype, max_model_len=max_model_len,
                                     **options)
        served = self._run(engine, prompts, max_new_tokens, logprobs=logprobs, timeout=timeout, log=log,
                           stop_ids=stop_ids)
        if not served.stats or not served.stats.steps:
            raise EngineError(f"{self.name} reported 0 verification steps: speculative decoding did not run")
        return served

    def generate(self, target: str, prompts: list[list[int]], max_new_tokens: int, *, dtype: str = "fp32",
                 max_model_len: int = 2048, timeout: float | None = None, log: Path | None = None,
                 stop_ids=None, **options) -> Served:
        """Greedy decoding of `prompts` by the target alone, stopping on `stop_ids` (see _run)."""
        engine = self.engine_request(target, None, None, dtype=dtype, max_model_len=max_model_len, **options)
        return self._run(engine, prompts, max_new_tokens, timeout=timeout, log=log, stop_ids=stop_ids)

"""The generation workers behind `VllmBackend`: one `vllm_generate_worker.py` process per engine replica.

A small target's vLLM engine is bound by its one engine-core CPU thread (per-request scheduling work grows with
the requests in flight), not by the GPU, so several engines on one GPU, each with a share of its memory, generate
more. Each replica's stdout is read by its own thread onto one shared queue, so the driver takes whichever answer
comes first, from any replica. vLLM's own log goes straight to the replica's log file (its stderr), line by line;
each worker runs in its own session, so stopping it stops its engine core too.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

from eyas.engines.base import HANG_ENV, EngineError, kill_group, report_hang

WORKER = Path(__file__).with_name("vllm_generate_worker.py")
PREFIX = "EYAS> "
GPU_SHARE = 90  # percent of GPU memory the replicas share: vLLM's own default gpu_memory_utilization, 0.9


def memory_share(replicas: int) -> float | None:
    """Each replica's gpu_memory_utilization: 0.9 / N rounded down to 2 decimals, so N of them fit where one
    engine alone would go. None for one replica: vLLM keeps its own default, as before replicas existed."""
    if replicas <= 1:
        return None
    if GPU_SHARE // replicas < 1:
        raise ValueError(f"engine_replicas {replicas}: at most {GPU_SHARE} engines can share one GPU's memory")
    return (GPU_SHARE // replicas) / 100


def replica_log(log: Path, index: int) -> Path:
    """Replica 0 writes `log` itself (vllm.log), replica i `vllm-i.log` beside it."""
    return log if index == 0 else log.with_name(f"{log.stem}-{index}{log.suffix}")


def engine_env(env: dict) -> dict:
    """A worker's environment: vLLM logs to stdout by default, which is the worker's protocol pipe, read by the
    driver; sent to stderr instead (the log file itself), every line of the engine core's start-up reaches the log
    as it is written, whatever the driver is doing (a start-up that hangs says where). Unbuffered, so does a print."""
    return {**HANG_ENV, **env, "VLLM_LOGGING_STREAM": env.get("VLLM_LOGGING_STREAM", "ext://sys.stderr"),
            "PYTHONUNBUFFERED": "1"}


class Replica:
    """One worker process and the thread reading its stdout: each `EYAS> ` message goes onto the shared queue as
    (index, message), anything else printed there goes to the log (vLLM's own logging writes it directly), and
    (index, None) follows once stdout ends (the worker exited)."""

    def __init__(self, index: int, python: str, config: Path, log: Path, env: dict, answers: queue.Queue,
                 label: str = ""):
        self.index, self.log, self.label = index, log, label
        self.in_flight = self.answered = 0
        self.stats: dict = {}  # the worker's own step counts, from its closing message
        self._logf = open(log, "w", buffering=1)   # line-buffered: what the driver writes shows at once too
        self.proc = subprocess.Popen([str(python), "-P", str(WORKER), str(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._logf, text=True, env=engine_env(env),
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._pump, args=(answers,), daemon=True,
                                        name=f"vllm-replica-{index}")
        self._reader.start()

    def _pump(self, answers: queue.Queue) -> None:
        try:
            for line in self.proc.stdout:
                if line.startswith(PREFIX):
                    answers.put((self.index, json.loads(line[len(PREFIX):])))
                else:
                    self._logf.write(line)
        finally:
            self._logf.flush()  # before the driver reads the log to report the exit
            answers.put((self.index, None))

    def send(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")

    def flush(self) -> None:
        self.proc.stdin.flush()

    def died(self) -> EngineError:
        """The error for a worker that exited (or stopped reading), naming its log, with the log's tail."""
        self._reader.join(timeout=10)
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # stdin broke but the process lingers: it cannot be driven any more
            kill_group(self.proc)
            code = self.proc.wait()
        kill_group(self.proc)   # an engine core the dead worker left behind
        return EngineError(f"the vLLM generation worker{self.label} exited (code {code}); log {self.log}:\n"
                           + self.log.read_text()[-3000:])

    def stop(self, timeout: float = 60) -> None:
        """Wait for the worker to exit (it was asked to close), else kill it; then release its log."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            self.proc.wait()
        kill_group(self.proc)   # whatever of its engine outlived it
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # unsent requests of a worker that is gone
                pass
        self._logf.close()

    def kill(self) -> None:
        kill_group(self.proc)
        self.stop()

    def hang(self) -> str:
        """A worker that never came up: its processes and stacks into its log (report_hang), then killed."""
        where = report_hang(self.proc, self._logf)
        self.kill()
        return where

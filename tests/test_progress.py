"""Progress with ETA in a log file (not a terminal): the helper's lines, and regenerate using it.
(extract: tests/store/test_extract_progress.py; eval: tests/decode/test_eval.py.)"""

import io
import json
import re
import sys

from eyas.progress import Progress


def test_log_lines_have_count_rate_and_eta():
    log = io.StringIO()  # not a tty: plain lines
    with Progress("work", 4, "rows", stream=log, interval=0) as p:
        for _ in range(4):
            p.update(1)
            p.note("loss 1.23")
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("work: 0/4 rows (0%)") and lines[0].endswith("ETA ?")
    assert re.match(r"work: 2/4 rows \(50%\), [\d.]+ rows/s, elapsed 0:\d\d, ETA 0:\d\d, loss 1.23$", lines[2])
    assert lines[-1].startswith("work: 4/4 rows (100%)") and ", done" in lines[-1]
    assert len(lines) == 6   # start, 4 updates (interval 0), end


def test_interval_limits_lines_and_unknown_total():
    log = io.StringIO()
    p = Progress("gen", None, "rows", stream=log, interval=3600)
    for _ in range(100):
        p.update(1)
    p.close()
    p.close()  # idempotent
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("gen: 100 rows, ") and "done" in lines[1]


def test_disabled_prints_nothing():
    log = io.StringIO()
    with Progress("x", 3, stream=log, enabled=False) as p:
        p.update(3)
    assert log.getvalue() == ""


class Scripted:
    """Stands in for a HF model: generate() emits one token per step for every row and calls the stopping
    criteria each step, as transformers does; row r's answer is r + 1 words, then EOS at step r + 1."""

    def __init__(self, eos: int, word: int, log):
        from types import SimpleNamespace

        self.eos, self.word, self.log = eos, word, log
        self.config = SimpleNamespace(eos_token_id=eos)   # where eyas reads the stop ids (eyas.target.special)

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, stopping_criteria,
                 **kw):
        import torch

        ids = input_ids
        for step in range(max_new_tokens):
            col = torch.tensor([[self.eos if step == r + 1 else (pad_token_id if step > r + 1 else self.word)]
                                for r in range(ids.shape[0])])
            ids = torch.cat([ids, col], 1)
            print(f"step {step}", file=self.log, flush=True)
            stopping_criteria(ids, None)
        return ids


def test_regenerate_bar_moves_per_row_inside_one_batch(tmp_path, capsys, monkeypatch):
    """The demo's case: all rows in one chunk and one generate call; the count must rise as rows end."""
    from eyas.data.backends import HFBackend
    from eyas.data.regenerate import RegenerateConfig, regenerate
    from tests.data.templates import make_tokenizer

    monkeypatch.setenv("EYAS_PROGRESS_INTERVAL", "0")
    rows = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
            for i in range(4)]
    (tmp_path / "in.json").write_text(json.dumps(rows))
    tok = make_tokenizer("smollm2")
    backend = HFBackend("scripted", model=Scripted(tok.eos_token_id, tok("hello")["input_ids"][0], sys.stderr), tokenizer=tok, batch_size=8,
                        max_new_tokens=6, device="cpu")
    s = regenerate(RegenerateConfig(target="t", data=str(tmp_path / "in.json"), out=tmp_path / "o.jsonl",
                                    batch_size=8, max_samples=4), backend=backend)
    assert s["written"] == 4
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("step", "regenerate"))]
    # row r's end-of-turn token comes at step r + 1: the bar shows r + 1 rows right after that step
    for r in range(4):
        i = err.index(f"step {r + 1}")
        assert err[i + 1].startswith(f"regenerate (hf): {r + 1}/4 rows"), err[i:i + 2]
    assert err[-1].startswith("regenerate (hf): 4/4 rows (100%)") and "done" in err[-1]


def test_heartbeat_line_while_one_long_item_runs():
    """No update for a while (one long generate batch): the log still gets a line per interval."""
    import time

    log = io.StringIO()
    p = Progress("slow", 2, "rows", stream=log, interval=0.1)
    time.sleep(0.45)
    p.close()
    lines = log.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("slow: 0/2 rows") for line in lines)
    assert re.search(r"elapsed 0:00, ETA \?$", lines[2]) and lines[-1].endswith("done")


def test_heartbeat_stops_quietly_when_its_stream_closes():
    """A bar left open (its stage failed) whose stream is closed under it (interpreter exit): the heartbeat
    thread ends without a traceback."""
    import threading
    import time

    log = io.StringIO()
    errors = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        p = Progress("left-open", 3, "rows", stream=log, interval=0.05)
        log.close()
        time.sleep(0.3)
        assert not any(t.name == "progress-left-open" and t.is_alive() for t in threading.enumerate())
        assert errors == [] and not p.closed
    finally:
        threading.excepthook = hook

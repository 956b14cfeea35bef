"""extract says what it is doing when its output goes to a log file: lines with count, rate and ETA."""

import re


def test_extract_reports_progress_into_a_log(tiny_target, prepared, tmp_path, capsys, monkeypatch):
    from eyas.cli import main

    monkeypatch.setenv("EYAS_PROGRESS_INTERVAL", "0")
    rc = main(["extract", "--target", str(tiny_target), "--data", str(prepared), "--out", str(tmp_path / "s"),
               "--token-budget", "64", "--device", "cpu"])
    assert rc == 0
    err = capsys.readouterr().err
    counts = [int(m) for m in re.findall(r"^extract: (\d+)/12 rows", err, re.M)]
    assert counts[0] == 0 and counts[-1] == 12 and len(counts) >= 4      # moves batch by batch, not only at the end
    assert counts == sorted(counts) and re.search(r"^extract: 12/12 rows \(100%\).*done, \d+ tok/s$", err, re.M)


def test_a_writer_failing_at_close_still_closes_the_bar(tiny_target, prepared, tmp_path, monkeypatch, capsys):
    """The store's writer raising in close() (a full disk at the last flush): the error reaches the caller and the
    progress bar is closed too, so no heartbeat thread is left printing (it once did, after pytest's summary)."""
    from eyas.cli import main
    from eyas.progress import Progress
    from eyas.store.writer import ShardWriter, StoreError

    bars = []
    real_init = Progress.__init__
    monkeypatch.setattr(Progress, "__init__", lambda self, *a, **k: bars.append(self) or real_init(self, *a, **k))

    def failing_close(self):
        raise StoreError("shard writer failed: No space left on device (stand-in)")

    monkeypatch.setattr(ShardWriter, "close", failing_close)
    rc = main(["extract", "--target", str(tiny_target), "--data", str(prepared), "--out", str(tmp_path / "s"),
               "--token-budget", "64", "--device", "cpu"])
    assert rc == 1 and "No space left on device" in capsys.readouterr().err   # one clear line from the CLI
    ours = [b for b in bars if b.desc.startswith("extract")]
    assert ours and all(b.closed for b in ours)

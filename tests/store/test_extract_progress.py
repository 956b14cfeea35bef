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

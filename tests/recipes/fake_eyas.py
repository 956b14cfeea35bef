"""A stand-in for `python -m eyas.cli` in runner tests: starts in milliseconds, logs its arguments to
OUT's calls.log and writes OUT; `--hang` (without --resume) hangs until killed, `--sleep S` takes S seconds (without --resume),
`--fail` exits 5."""
import sys
import time
from pathlib import Path

args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
with open(out.parent / "calls.log", "a") as f:
    f.write(" ".join(args) + "\n")
if "--fail" in args:
    sys.exit(5)
if "--hang" in args and "--resume" not in args:
    (out.parent / "hanging").write_text(args[0])
    time.sleep(3600)
if "--sleep" in args and "--resume" not in args:
    time.sleep(float(args[args.index("--sleep") + 1]))
out.write_text("ok")

"""Shared tail of the bench scripts: print the JSON result and write it to --out."""

import json
from pathlib import Path


def emit(result: dict, out: Path | None) -> dict:
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return result

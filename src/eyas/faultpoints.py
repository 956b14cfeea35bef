"""Named points where a fault-injection test (tests/, bench/faults.py) may stop a process at an exact moment.

`pause_at(STAGE, name)`: with $EYAS_<STAGE>_PAUSE_AT == name, write the name to $EYAS_<STAGE>_PAUSE_MARK (so the
test knows the moment has come) and hang until killed. A no-op otherwise: one environment lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause_at(stage: str, name: str) -> None:
    if os.environ.get(f"EYAS_{stage}_PAUSE_AT") != name:
        return
    mark = os.environ.get(f"EYAS_{stage}_PAUSE_MARK")
    if mark:
        Path(mark).write_text(name)
    time.sleep(3600)

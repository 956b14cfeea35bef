"""Named points where a fault-injection test (tests/, bench/faults.py) may stop a process at an exact moment.

`pause_at(STAGE, name)`: when the stage's PAUSE_AT switch (e.g. $EYAS_STORE_PAUSE_AT) == name, write the name to its
PAUSE_MARK file (so the test knows the moment has come) and hang until killed. A no-op otherwise: one lookup.
"""

from __future__ import annotations

import time
from pathlib import Path

from eyas import env

# stage -> (the switch naming the point, the switch naming the mark file): eyas.env.SWITCHES
SWITCHES = {"STORE": ("EYAS_STORE_PAUSE_AT", "EYAS_STORE_PAUSE_MARK"),
            "TRAIN": ("EYAS_TRAIN_PAUSE_AT", "EYAS_TRAIN_PAUSE_MARK")}


def pause_at(stage: str, name: str) -> None:
    at, mark_switch = SWITCHES[stage]
    if env.get(at) != name:
        return
    mark = env.get(mark_switch)
    if mark:
        Path(mark).write_text(name)
    time.sleep(3600)

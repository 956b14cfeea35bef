"""Session fixtures (one tiny target dir, one tiny PREPARED dir) for all store tests; see storekit.py."""

from storekit import prepared, tiny_target  # noqa: F401  (pytest finds fixtures by name here)

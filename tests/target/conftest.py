import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared, oversubscribed CPU two
    OpenMP threads spin-wait on each other (measured: one 8-layer forward 1.8 s with 2 threads,
    0.04 s with 1). Restored after each test so other directories keep their setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

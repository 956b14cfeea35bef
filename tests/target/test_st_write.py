"""SafetensorsWriter writes, tensor by tensor from threads, the file `safetensors.torch.save_file` writes, byte for
byte; a tensor that does not fit its layout, or one never written, is named, and a failed write leaves no file."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from eyas.target.st_write import DTYPES, SafetensorsWriter


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    state = {}
    for i, dtype in enumerate(DTYPES):
        x = torch.randn(3 + i, 5, generator=g) * 50
        state[f"layers.{i}.w"] = x > 0 if dtype == torch.bool else x.to(dtype)
        state[f"b{i}"] = (torch.randn(7, generator=g) * 50).to(dtype)
    state["empty"] = torch.zeros(0, 4, dtype=torch.bfloat16)
    state["big"] = torch.randn(1024, 1024, generator=g).to(torch.bfloat16)
    return state


@pytest.mark.parametrize("workers", [1, 3])
def test_file_equals_save_files_byte_for_byte(tmp_path, workers):
    state = _state()
    save_file(state, tmp_path / "ref.safetensors", metadata={"format": "pt"})
    layout = {k: (v.dtype, tuple(v.shape)) for k, v in state.items()}
    with SafetensorsWriter(tmp_path / "ours.safetensors", layout, {"format": "pt"}, workers=workers) as w:
        for k in reversed(list(state)):   # any order: each tensor goes to its own offset
            w.put(k, state[k])
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    back = load_file(tmp_path / "ours.safetensors")
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_a_tensor_off_its_layout_or_never_written_is_named(tmp_path):
    layout = {"a": (torch.bfloat16, (2, 3)), "b": (torch.float32, (4,))}
    with pytest.raises(ValueError, match=r"w.safetensors: tensor a is torch.float32 \[2, 3\], its layout says "
                                         r"torch.bfloat16 \[2, 3\]"):
        with SafetensorsWriter(tmp_path / "w.safetensors", layout) as w:
            w.put("a", torch.zeros(2, 3))
    assert not (tmp_path / "w.safetensors").exists()
    with pytest.raises(KeyError, match="tensor c is not in the file's layout"):
        with SafetensorsWriter(tmp_path / "w.safetensors", layout) as w:
            w.put("c", torch.zeros(1))
    w = SafetensorsWriter(tmp_path / "w.safetensors", layout)
    w.put("a", torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="tensor a was written twice"):
        w.put("a", torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"w.safetensors: tensor b was never written \(1 missing\)"):
        w.close()
    with pytest.raises(ValueError, match="tensor x has dtype torch.complex64, which this writer cannot hold"):
        SafetensorsWriter(tmp_path / "c.safetensors", {"x": (torch.complex64, (2,))})

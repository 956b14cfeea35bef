"""eyas's GGUF header parse equals `gguf.GGUFReader`'s (keys, values, types, tensor infos and data) on the tiny
llama/qwen2 GGUFs and on random metadata of every value type; a damaged file is one line naming it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType as V, GGUFWriter
from hypothesis import HealthCheck, given, settings, strategies as st

from eyas.target.gguf_header import read_header
from eyas.target.gguf_verify import header_differences
from tests.target.fixtures import CHAT_TEMPLATE, tiny_llama, tiny_qwen2, write_tiny_gguf


def _tiny(tmp_path, arch: str):
    model = tiny_llama(seed=3, tie=False) if arch == "llama" else tiny_qwen2(seed=4)
    qtypes = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q4_K if arch == "qwen2" else Q.Q4_0,
              "blk.0.ffn_up.weight": Q.F16, "blk.1.ffn_down.weight": Q.Q6_K if arch == "qwen2" else Q.Q5_1}
    return write_tiny_gguf(tmp_path / f"{arch}.gguf", model, arch=arch, qtypes=qtypes, chat_template=CHAT_TEMPLATE)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_header_equals_gguf_reader(tmp_path, arch):
    path = _tiny(tmp_path, arch)
    assert header_differences(path) == []
    h, reader = read_header(path), GGUFReader(str(path))
    assert h.arch == arch and h.version == 3 and h.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    assert isinstance(h.metadata["tokenizer.ggml.tokens"], list)
    for ours, ref in zip(h.tensors, reader.tensors, strict=True):
        assert np.array_equal(h.data(ours), np.asarray(ref.data).reshape(-1).view(np.uint8)), ours.name
    assert {t.qtype for t in h.tensors} >= {Q.F32, Q.F16, Q.Q8_0}


_TYPED = {  # value type -> (strategy for a value, how GGUFWriter is told)
    V.UINT8: st.integers(0, 255), V.INT8: st.integers(-128, 127), V.UINT16: st.integers(0, 2**16 - 1),
    V.INT16: st.integers(-2**15, 2**15 - 1), V.UINT32: st.integers(0, 2**32 - 1),
    V.INT32: st.integers(-2**31, 2**31 - 1), V.UINT64: st.integers(0, 2**64 - 1),
    V.INT64: st.integers(-2**63, 2**63 - 1), V.BOOL: st.booleans(),
    V.FLOAT32: st.floats(width=32, allow_nan=False), V.FLOAT64: st.floats(allow_nan=False),
    V.STRING: st.text(max_size=12),   # any unicode: CJK, emoji, control characters
}


@st.composite
def _kv(draw):
    vtype = draw(st.sampled_from(list(_TYPED)))
    if draw(st.booleans()):
        return draw(st.lists(_TYPED[vtype], min_size=1, max_size=40)), V.ARRAY, vtype
    return draw(_TYPED[vtype]), vtype, None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kvs=st.lists(_kv(), min_size=1, max_size=8))
def test_random_metadata_of_every_type_equals_gguf_reader(tmp_path_factory, kvs):
    path = tmp_path_factory.mktemp("kv") / "kv.gguf"
    w = GGUFWriter(str(path), "llama")
    for i, (value, vtype, sub) in enumerate(kvs):
        w.add_key_value(f"test.k{i}", value, vtype, sub_type=sub)
    w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert header_differences(path) == []
    h = read_header(path)
    assert h.tensors[0].shape == (2, 3) and h.data(h.tensors[0]).view(np.float32).tolist() == list(range(6))


def test_nested_arrays_keep_their_shape(tmp_path):
    path = tmp_path / "nested.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_key_value("test.nested", [[1, 2], [3, 4, 5]], V.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    h = read_header(path)
    assert [a.tolist() for a in h.metadata["test.nested"]] == [[1, 2], [3, 4, 5]]
    assert h.types["test.nested"] == (V.ARRAY, V.ARRAY, V.INT32)
    assert [x for a in h.metadata["test.nested"] for x in a.tolist()] == GGUFReader(str(path)).fields[
        "test.nested"].contents()


@pytest.mark.parametrize("cut", [3, 20, 200, 2000])
def test_a_file_cut_short_is_one_line_naming_it(tmp_path, cut):
    full = _tiny(tmp_path, "llama").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(full[:cut])
    with pytest.raises(ValueError, match=r"cut\.gguf: ") as err:
        read_header(bad)
    assert "\n" not in str(err.value)


def test_a_file_cut_inside_its_tensors_names_the_tensor(tmp_path):
    full = _tiny(tmp_path, "llama").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(full[:-100])
    with pytest.raises(ValueError, match=r"cut\.gguf: tensor '.+' ends at byte .* past the end of the file "
                                         r".*cut short"):
        read_header(bad)


def test_not_a_gguf_big_endian_and_old_versions_are_named(tmp_path):
    good = _tiny(tmp_path, "llama").read_bytes()
    cases = {b"definitely not a gguf file at all": "starts with b'defi', not b'GGUF'",
             good[:4] + (1).to_bytes(4, "little") + good[8:]: "GGUF version 1; eyas reads versions 2, 3",
             good[:4] + (3).to_bytes(4, "big") + good[8:]: "a big-endian GGUF"}
    for i, (data, message) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.gguf"
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=f"bad{i}.gguf: .*{message}"):
            read_header(bad)
    with pytest.raises(ValueError, match="missing.gguf: not a readable GGUF file"):
        read_header(tmp_path / "missing.gguf")


def test_a_key_given_twice_is_named(tmp_path):
    path = tmp_path / "dup.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint32("test.aaa", 1)
    w.add_uint32("test.bbb", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.write_bytes(path.read_bytes().replace(b"test.bbb", b"test.aaa"))
    with pytest.raises(ValueError, match=r"dup.gguf: .*key 'test.aaa' appears twice"):
        read_header(path)

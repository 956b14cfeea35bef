"""eyas.devices: the SDPA backend rule for shape-varying forwards (the device/dtype vocabulary is covered
by tests/test_flags.py and tests/test_owners.py)."""

import torch

from eyas.data.generate import Generator
from eyas.decode.speculative import ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.devices import varying_shape_attention
from eyas.target import wrap_model


def test_varying_shape_attention_turns_off_cudnn_only_inside():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with varying_shape_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def _spy_sdpa(monkeypatch):
    """Records, per SDPA call, (query length, whether cuDNN was allowed)."""
    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, *a, **k):
        calls.append((q.shape[-2], torch.backends.cuda.cudnn_sdp_enabled()))
        return real(q, *a, **k)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def test_prefills_run_without_cudnn_and_decode_steps_keep_the_default(monkeypatch):
    model = _tiny()
    calls = _spy_sdpa(monkeypatch)
    gen = Generator(model, batch_size=2, capacity=64, eos=[63], graph="eager")
    calls.clear()
    gen.generate([[1, 2, 3, 4, 5], [6, 7, 8]], 4)
    prefill = [c for c in calls if c[0] == 5]  # one group, right-padded to its longest prompt
    decode = [c for c in calls if c[0] == 2]   # grouped decode attention: the 2 query heads of a KV head
    assert prefill and not any(allowed for _, allowed in prefill)
    assert len(prefill) + len(decode) == len(calls) and len(prefill) == 2  # a call per layer
    assert decode and all(allowed for _, allowed in decode) == torch.backends.cuda.cudnn_sdp_enabled()

    gen = Generator(model, batch_size=2, capacity=64, eos=[63], graph="eager", decode_sdpa="no-cudnn")
    calls.clear()
    out = gen.generate([[1, 2, 3, 4, 5], [6, 7, 8]], 4)
    assert calls and not any(allowed for _, allowed in calls)  # the A/B switch: decode steps without cuDNN too
    assert out == Generator(model, batch_size=2, capacity=64, eos=[63], graph="eager").generate(
        [[1, 2, 3, 4, 5], [6, 7, 8]], 4)

    runner = TargetRunner(model, wrap_model(model).layout, [0], 64)
    calls.clear()
    ar_generate(runner, [1, 2, 3, 4, 5, 6], 3)
    assert calls and not any(allowed for _, allowed in calls)  # uncompiled runner: every step is eager


def test_capture_graph_warms_twice_on_a_side_stream_then_captures_into_the_pool(monkeypatch):
    """The one owner of "warm up, then capture" (prefill chunks, the AR step, the prompt catch-up, the generator's
    decode step): two runs on a side stream, each followed by `after`, then one run inside the graph's capture, whose
    output it returns. CUDA's calls are stood in for here, so the order is checked without a GPU."""
    import contextlib

    import torch

    from eyas.devices import capture_graph

    log = []

    class Stream:
        def __init__(self, device=None):
            log.append(("stream", device))

        def wait_stream(self, other):
            log.append(("wait",))

    class Graph:
        pass

    @contextlib.contextmanager
    def on(stream):
        log.append(("side on",))
        yield
        log.append(("side off",))

    @contextlib.contextmanager
    def graph(g, pool=None):
        log.append(("capture", pool))
        yield
        log.append(("captured",))

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    runs = iter(range(3))
    g, out = capture_graph(lambda: log.append(("run",)) or next(runs), "cuda:0", pool="P",
                           after=lambda: log.append(("after",)))
    assert isinstance(g, Graph) and out == 2
    steps = [e[0] for e in log if e[0] not in ("stream", "wait")]
    assert steps == ["side on", "run", "after", "run", "after", "side off", "capture", "run", "captured"]
    assert ("capture", "P") in log and ("stream", "cuda:0") in log

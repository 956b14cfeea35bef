"""`eyas regenerate`: turn-by-turn replacement, resumable output, accounting; hf on a tiny model, openai on a flaky server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from eyas.data import iter_conversations
from eyas.data.backends import HFBackend, OpenAIBackend
from eyas.data.prepare import PrepareConfig, prepare
from eyas.data.regenerate import RegenerateConfig, regenerate
from tests.data.templates import make_target_dir, make_tokenizer


def conv(i: int, turns: int, tag: str = "") -> dict:
    t = []
    for k in range(turns):
        t += [{"from": "human", "value": f"{tag}question {i}.{k}"}, {"from": "gpt", "value": f"old answer {i}.{k}"}]
    return {"id": f"c{i}", "conversations": t}


@pytest.fixture
def data(tmp_path):
    rows = [conv(0, 1), conv(1, 3), conv(2, 2), {"conversations": [{"from": "gpt", "value": "x"}]}, conv(4, 1)]
    p = tmp_path / "in.json"
    p.write_text(json.dumps(rows))
    return p


class Echo:
    """A fake backend answering from the prompt, so turn-by-turn wiring is checkable exactly."""
    name = "echo"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts):
        self.prompts += prompts
        return [(f"A{sum(m['role'] == 'assistant' for m in p)}:{p[-1]['content']}", "stop") for p in prompts]


def test_turn_by_turn_and_accounting(data, tmp_path):
    out = tmp_path / "out.jsonl"
    backend = Echo()
    s = regenerate(RegenerateConfig(target="t", data=str(data), out=out, batch_size=2, assistant_first="reject"),
                   backend=backend)
    assert (s["input"], s["written"], s["failed"], s["skipped"]) == (5, 4, 1, 0)
    rows = {r["row"]: r for r in map(json.loads, out.read_text().splitlines())}
    two = rows[2]["messages"]
    assert [m["role"] for m in two] == ["user", "assistant", "user", "assistant"]
    assert two[1]["content"] == "A0:question 2.0" and two[3]["content"] == "A1:question 2.1"
    assert [m for m in backend.prompts if m[-1]["content"] == "question 2.1"][0][1] == two[1]  # own answer in context
    errors = [json.loads(x) for x in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert errors[0]["row"] == 3 and "assistant_first" in errors[0]["error"]
    recs = list(iter_conversations(out))  # prepare reads the output as messages JSONL
    assert all(r.ok for r in recs) and len(recs) == 4


def test_resume_skips_done_rows_and_repairs_a_torn_line(data, tmp_path):
    out = tmp_path / "out.jsonl"
    cfg = RegenerateConfig(target="t", data=str(data), out=out, max_samples=2)
    assert regenerate(cfg, backend=Echo())["written"] == 2
    with open(out, "a") as f:
        f.write('{"row": 9, "messa')  # killed mid-write
    s = regenerate(cfg.model_copy(update={"max_samples": None}), backend=Echo())
    assert (s["input"], s["skipped"], s["written"] + s["failed"]) == (5, 2, 3)
    rows = [json.loads(x)["row"] for x in out.read_text().splitlines()]
    assert sorted(rows) == [0, 1, 2, 4] and len(rows) == len(set(rows))


def test_a_resume_with_nothing_left_loads_no_model(data, tmp_path, monkeypatch):
    """Every row already written: the stage counts them and returns without building its backend (a recipe's
    resumed generation step used to load the target, ~30 s on a GPU, to write nothing)."""
    import eyas.data.regenerate as stage

    out = tmp_path / "out.jsonl"
    cfg = RegenerateConfig(target="t", data=str(data), out=out, max_samples=3)
    assert regenerate(cfg, backend=Echo())["written"] == 3

    def no_model(cfg):
        raise AssertionError("a backend was built with nothing to write")
    monkeypatch.setattr(stage, "_make_backend", no_model)
    s = regenerate(cfg.model_copy(update={"max_samples": 2}))
    assert (s["input"], s["skipped"], s["written"], s["model"]) == (2, 2, 0, "t")
    with pytest.raises(AssertionError, match="nothing to write"):   # a row left: the backend is built
        regenerate(cfg.model_copy(update={"max_samples": 5}))


def test_hf_backend_tiny_model_matches_unbatched_greedy(data, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_tokenizer("smollm2")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()
    kw = dict(model=model, tokenizer=tok, max_new_tokens=6, device="cpu")
    batched = regenerate(RegenerateConfig(target="tiny", data=str(data), out=tmp_path / "a.jsonl"),
                         backend=HFBackend("tiny", batch_size=4, **kw))
    single = regenerate(RegenerateConfig(target="tiny", data=str(data), out=tmp_path / "b.jsonl"),
                        backend=HFBackend("tiny", batch_size=1, static_cache=True, **kw))  # the GPU path's cache
    assert batched["written"] + batched["failed"] + batched["skipped"] == batched["input"] == 5
    assert batched["written"] >= 3  # a random model rarely ends a turn at once; most rows must be answered
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    for r in map(json.loads, (tmp_path / "a.jsonl").read_text().splitlines()):
        assert set(r["finish_reasons"]) <= {"stop", "length"}
        first = tok.apply_chat_template([r["messages"][0]], tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(first, add_special_tokens=False)["input_ids"]])
        ref = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        ref = ref[:ref.index(tok.eos_token_id)] if tok.eos_token_id in ref else ref
        assert r["messages"][1]["content"] == tok.decode(ref, skip_special_tokens=True).strip()


class Flaky(BaseHTTPRequestHandler):
    """OpenAI-style server: first attempt of every prompt fails with 503; 'FATAL' -> 400; 'DOWN' -> always 500."""
    seen: dict = {}
    lock = threading.Lock()

    def log_message(self, *a):  # keep test output quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        last = msgs[-1]["content"]
        with self.lock:
            key = json.dumps(msgs)
            self.seen[key] = self.seen.get(key, 0) + 1
            first = self.seen[key] == 1
        if "FATAL" in last:
            return self._send(400, {"error": "bad request"})
        if "DOWN" in last or first:
            return self._send(503 if first else 500, {"error": "busy"})
        n = sum(m["role"] == "assistant" for m in msgs)
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": f"srv{n}:{last}"},
                                      "finish_reason": "stop"}], "model": body["model"]})

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    Flaky.seen = {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_backend_retries_records_errors_and_feeds_prepare(tmp_path, server):
    rows = [conv(i, 1 + i % 3) for i in range(8)] + [conv(8, 2, tag="FATAL "), conv(9, 1, tag="DOWN ")]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    cfg = RegenerateConfig(target="tiny", data=str(data), out=out, backend="openai", base_url=server,
                           concurrency=4, max_retries=2, retry_backoff=0.001)
    s = regenerate(cfg)
    assert (s["input"], s["written"], s["failed"], s["skipped"]) == (10, 8, 2, 0)
    errors = {e["row"]: e["error"] for e in map(json.loads, (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines())}
    assert errors[8].startswith("http_400") and errors[9].startswith("retries_exhausted")
    for r in map(json.loads, out.read_text().splitlines()):
        answers = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert answers == [f"srv{k}:question {r['row']}.{k}" for k in range(len(answers))]
    # the output prepares: every regenerated row is kept
    target = make_target_dir(tmp_path / "tgt", "smollm2")
    p = prepare(PrepareConfig(target=str(target), data=str(out), out=tmp_path / "prep", max_length=256))
    assert p["rows_in"] == p["rows_out"] == 8
    # a second run retries only the failed rows
    s2 = regenerate(cfg)
    assert (s2["skipped"], s2["failed"]) == (8, 2)


def test_openai_backend_unreachable_server_fails_rows_not_the_run(tmp_path):
    b = OpenAIBackend("http://127.0.0.1:9/v1", "m", max_retries=1, backoff=0.001, timeout=2)
    data = tmp_path / "in.json"
    data.write_text(json.dumps([conv(0, 1)]))
    s = regenerate(RegenerateConfig(target="m", data=str(data), out=tmp_path / "o.jsonl", backend="openai"), backend=b)
    assert (s["written"], s["failed"]) == (0, 1)


def test_out_directory_gets_a_file_inside(data, tmp_path):
    (tmp_path / "d2").mkdir()
    s = regenerate(RegenerateConfig(target="t", data=str(data), out=tmp_path / "d2"), backend=Echo())
    assert s["out"] == str(tmp_path / "d2" / "regenerated.jsonl") and s["written"] == 4


# ---------------------------------------------------------------- the output is owned (eyas.outputs)
def test_out_that_is_the_input_or_links_to_it_is_refused_and_left_whole(data, tmp_path):
    before = data.read_bytes()
    with pytest.raises(ValueError, match="is the --data"):
        regenerate(RegenerateConfig(target="t", data=str(data), out=data, overwrite=True), backend=Echo())
    link = tmp_path / "link.jsonl"
    link.symlink_to(data)
    with pytest.raises(ValueError, match=f"resolves to {data}"):
        regenerate(RegenerateConfig(target="t", data=str(data), out=link), backend=Echo())
    assert data.read_bytes() == before


def test_a_foreign_file_is_refused_unless_overwrite(data, tmp_path):
    out = tmp_path / "notes.jsonl"
    out.write_text('{"messages": [{"role": "user", "content": "mine"}]}\n')
    with pytest.raises(ValueError, match="already holds a file eyas did not write.*--overwrite"):
        regenerate(RegenerateConfig(target="t", data=str(data), out=out), backend=Echo())
    assert "mine" in out.read_text()
    s = regenerate(RegenerateConfig(target="t", data=str(data), out=out, overwrite=True), backend=Echo())
    assert s["written"] == 4 and "mine" not in out.read_text()


def test_a_damaged_line_inside_an_output_loses_nothing(data, tmp_path):
    out = tmp_path / "out.jsonl"
    cfg = RegenerateConfig(target="t", data=str(data), out=out)
    regenerate(cfg, backend=Echo())
    lines = out.read_text().splitlines(keepends=True)
    damaged = lines[0] + "not json\n" + "".join(lines[1:])
    out.write_text(damaged)
    with pytest.raises(ValueError, match=r"out.jsonl:2: not a written row.*nothing was changed"):
        regenerate(cfg, backend=Echo())
    assert out.read_text() == damaged


@pytest.mark.parametrize("change", [{"temperature": 0.7}, {"max_new_tokens": 9}, {"target": "other"},
                                    {"seed": 3}])
def test_resume_with_other_settings_is_refused_naming_them(data, tmp_path, change):
    out = tmp_path / "out.jsonl"
    regenerate(RegenerateConfig(target="t", data=str(data), out=out, max_samples=2), backend=Echo())
    before = out.read_text()
    flag = "--" + next(iter(change)).replace("_", "-")
    base = {"target": "t", "data": str(data), "out": out}
    with pytest.raises(ValueError, match=f"started with other settings: {flag} "):
        regenerate(RegenerateConfig(**{**base, **change}), backend=Echo())
    assert out.read_text() == before
    s = regenerate(RegenerateConfig(**{**base, **change}, overwrite=True), backend=Echo())
    assert s["skipped"] == 0 and s["written"] == 4    # started over: no row of the first run is kept


def test_resume_with_another_target_of_the_same_name_is_refused(data, tmp_path):
    """The target is known by its content, not its path: B copied over A's directory is another target."""
    a = make_target_dir(tmp_path / "tgt", "smollm2")
    out = tmp_path / "out.jsonl"
    regenerate(RegenerateConfig(target=str(a), data=str(data), out=out, max_samples=2), backend=Echo())
    cfg = json.loads((a / "config.json").read_text())
    (a / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-3}))
    with pytest.raises(ValueError, match="--target .*content"):
        regenerate(RegenerateConfig(target=str(a), data=str(data), out=out), backend=Echo())


def test_tasks_resume_with_another_min_words_is_refused(tmp_path):
    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                    {"role": "assistant", "content": " ".join(["w"] * 50)}]}) + "\n"
                           for i in range(3)))
    out = tmp_path / "tasks.jsonl"
    regenerate(RegenerateConfig(target="t", data=f"tasks:{src}", out=out, task_min_words=40), backend=Echo())
    with pytest.raises(ValueError, match="--task-min-words 40 \\(now 60\\)"):
        regenerate(RegenerateConfig(target="t", data=f"tasks:{src}", out=out, task_min_words=60), backend=Echo())


def test_a_second_writer_on_the_same_out_is_refused(data, tmp_path):
    from eyas.outputs import claim

    out = tmp_path / "out.jsonl"
    with claim(out, "regenerate"):                       # another process writing it (a second flock conflicts)
        with pytest.raises(ValueError, match="another eyas process is writing it"):
            regenerate(RegenerateConfig(target="t", data=str(data), out=out), backend=Echo())
    assert regenerate(RegenerateConfig(target="t", data=str(data), out=out), backend=Echo())["written"] == 4


def test_self_prompts_from_a_server_is_one_line(tmp_path, capsys):
    from eyas.cli import main

    rc = main(["regenerate", "--target", "m", "--data", "self:3", "--backend", "openai", "--out",
               str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "--backend native or hf" in err[0]

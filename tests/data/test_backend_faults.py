"""The OpenAI backend against a misbehaving loopback server (issue #17 items 2 and 12), plus the harness's
20 server modes (bench/faults.py): rows fail with a reason, the run never aborts, nothing wrong is written,
the key goes nowhere else."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from eyas.data.backends import GenerationError, OpenAIBackend
from eyas.data.regenerate import RegenerateConfig, regenerate

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fake = _load("fake_openai")
KEY = fake.KEY


@pytest.fixture(scope="module")
def servers():
    srv, evil = fake.serve(fake.FakeOpenAI), fake.serve(fake.Evil)
    fake.FakeOpenAI.evil_port = evil.server_address[1]
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    evil.shutdown()


def backend(base, mode, **kw):
    return OpenAIBackend(base, mode, api_key=KEY, max_retries=kw.pop("max_retries", 1), backoff=0.01,
                         timeout=kw.pop("timeout", 2.0), **kw)


@pytest.mark.parametrize("mode", ["302", "307"])
def test_redirect_is_not_followed_and_the_key_stays_home(servers, mode):
    # item 2: urllib followed a 302 to another host, sent the Bearer key there, and kept that host's answer.
    fake.Evil.got_key.clear()
    with pytest.raises(GenerationError, match=rf"http_{mode}: the server redirects .*point --base-url"):
        backend(servers, mode).chat([{"role": "user", "content": "q"}])
    assert fake.Evil.got_key == []


@pytest.mark.parametrize("mode", ["non-utf8", "content-int", "content-list", "no-choices", "html"])
def test_bad_bodies_fail_the_row(servers, mode):
    # item 12: a non-UTF-8 body or a non-string content aborted the whole run.
    with pytest.raises(GenerationError, match="bad_response|retries_exhausted"):
        backend(servers, mode).chat([{"role": "user", "content": "q"}])


def test_request_timeout_is_a_deadline_not_per_read(servers):
    # item 12: a server dribbling one byte per 0.5 s never hit --request-timeout.
    t0 = time.monotonic()
    with pytest.raises(GenerationError, match="request-timeout"):
        backend(servers, "dribble", max_retries=0, timeout=1.5).chat([{"role": "user", "content": "q"}])
    assert time.monotonic() - t0 < 5


def test_retry_after_is_honoured(servers):
    t0 = time.monotonic()
    assert backend(servers, "429-retry-after").chat([{"role": "user", "content": "wait"}]) == ("ans:wait", "stop")
    assert time.monotonic() - t0 >= 1.0


def test_error_bodies_never_reach_errors_jsonl(servers, tmp_path, monkeypatch):
    # item 12: server error bodies (which may echo the key) were copied into errors.jsonl.
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in fake.conversations(2)))
    monkeypatch.setenv("K", KEY)
    out = tmp_path / "o.jsonl"
    s = regenerate(RegenerateConfig(target="401-echo-key", data=str(data), out=out, backend="openai",
                                    base_url=servers, api_key_env="K", max_retries=0))
    errors = (tmp_path / "o.jsonl.errors.jsonl").read_text()
    assert s["failed"] == 2 and "http_401" in errors and KEY not in errors


def test_twenty_server_failure_modes(tmp_path):
    faults = _load("faults")
    tally = faults.Tally()
    faults.family_server(tally, tmp_path)
    row = tally.rows["server"]
    assert row["injected"] == len(fake.SERVER_MODES) >= 15
    assert (row["wrong"], row["lost"], row["manual"]) == (0, 0, 0), tally.notes
    assert row["survived"] + row["detected"] == row["injected"]

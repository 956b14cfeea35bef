"""`eyas eval`'s recheck of divergences that are not ties: each such turn is decoded again, alone, in fp32 and in the
run's dtype, inside the same run. Divergences are forced by a speculative decoder that replaces one token of its
output by the target's least likely one (never a tie): in bf16 only (numerics), or in every dtype (a decoder bug)."""

import copy
import json

import pytest
import torch
from conftest import random_draft, tiny_llama, write_eval_dirs

import eyas.decode.divergence as divergence
from eyas.cli import main
from eyas.decode.speculative import SpecDecoder
from eyas.decode.target_step import TargetRunner
from eyas.target import drop_capture_hooks, find_layout

ORIGINAL = SpecDecoder.generate
SECOND_TURN = [ord(c) - 29 for c in "and again?"]   # the char tokenizer's ids: ' ' (32) is id 3


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return write_eval_dirs(tmp_path_factory.mktemp("recheck"))


def corrupting(dtypes, only_second_turn=False):
    """SpecDecoder.generate whose output's middle token becomes the target's least likely one there."""
    def generate(self, prompt, max_new_tokens, generator=None):
        out, st = ORIGINAL(self, prompt, max_new_tokens, generator)
        turn1 = any(prompt[i:i + len(SECOND_TURN)] == SECOND_TURN for i in range(len(prompt)))
        if self.runner.dtype in dtypes and len(out) > 1 and (turn1 or not only_second_turn):
            i = len(out) // 2
            logits = self.runner.model(input_ids=torch.tensor([prompt + out[:i]]), use_cache=False).logits[0, -1]
            out = out[:i] + [int(logits.argmin())] + out[i + 1:]
        return out, st
    return generate


def run_eval(dirs, tmp_path, capsys, *flags):
    out = tmp_path / "out.json"
    rc = main(["eval", "--target", str(dirs / "target"), "--draft", str(dirs / "draft"), "--bench",
               str(dirs / "bench.jsonl"), "--max-new-tokens", "8", "--chain", "2", "--device", "cpu",
               "--dtype", "bf16", "--out", str(out), *flags])
    assert rc == 0
    printed = capsys.readouterr()
    return json.loads(out.read_text())["results"][0], printed.out, printed.err


def test_a_bf16_only_divergence_is_numerics(dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SpecDecoder, "generate", corrupting({torch.bfloat16}, only_second_turn=True))
    r, table, err = run_eval(dirs, tmp_path, capsys)             # the default --recheck
    (d,) = [d for d in r["divergences"] if (d["question_id"], d["turn"]) == (1, 1)]
    assert d["tie"] is False and d["gap"] > 0
    rec = d["recheck"]
    assert rec["verdict"] == "numerics" and rec["fp32_identical"] is True
    assert rec["alone_identical"] is False                      # the lone bf16 decode still diverges
    # ...with the run's very outputs: the second turn's prompt held the baseline's first answer, as in the run
    assert rec["alone_reproduced"] is True and rec["dtype"] == "torch.bfloat16"
    assert rec["fp32_gap"] == pytest.approx(d["gap"], rel=0.1)  # fp32's view of the same (far from flat) point
    assert "fp32_divergence" not in rec
    assert r["unexplained_divergences"] == len([x for x in r["divergences"] if not x["tie"]]) >= 1
    assert r["unexplained_numerics"] == r["unexplained_divergences"]
    assert r["unexplained_decoder"] == r["unexplained_unchecked"] == 0
    assert "question 1 turn 1 (a) token" in table and "numerics (fp32 speculative == fp32 AR)" in table
    assert "DECODER" not in table + err and "eval recheck: question 1 turn 1" in err


def test_a_decoder_that_is_wrong_in_fp32_too_is_a_decoder_bug(dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SpecDecoder, "generate", corrupting({torch.bfloat16, torch.float32}))
    r, table, err = run_eval(dirs, tmp_path, capsys, "--recheck", "1")
    assert len(r["divergences"]) == 4 and r["unexplained_divergences"] == 4
    first, *rest = r["divergences"]
    rec = first["recheck"]
    assert rec["verdict"] == "decoder" and rec["fp32_identical"] is False
    assert rec["fp32_divergence"]["index"] == first["index"] and rec["fp32_divergence"]["tie"] is False
    assert all("recheck" not in d for d in rest)               # --recheck 1: one turn, the rest left alone
    assert (r["unexplained_decoder"], r["unexplained_numerics"], r["unexplained_unchecked"]) == (1, 0, 3)
    assert "!!! chain-2: 4 unexplained divergences (not a tie): 0 numerics, 1 decoder, 3 unchecked !!!" in table
    assert "!!! DECODER BUG: question 1 turn 0" in table and "!!! DECODER BUG: question 1 turn 0" in err
    assert table.count("not rechecked") == 3


def test_recheck_0_does_nothing(dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SpecDecoder, "generate", corrupting({torch.bfloat16}))

    def no_copy(*a, **k):
        raise AssertionError("--recheck 0 must not copy the models")
    monkeypatch.setattr(divergence, "_Fp32", no_copy)
    r, table, err = run_eval(dirs, tmp_path, capsys, "--recheck", "0")
    assert r["unexplained_divergences"] == 4 and all("recheck" not in d for d in r["divergences"])
    assert not set(divergence.COUNTS) & set(r)
    assert "4 unexplained divergences (not a tie); rerun with --recheck N" in table and "eval recheck" not in err


def test_a_copied_model_does_not_write_into_the_original_runner():
    """deepcopy keeps forward hooks: without drop_capture_hooks the copy's forward would overwrite the session
    runner's captured aux states (and in fp32, under the compiled runner's feet)."""
    model = tiny_llama()
    draft, target = random_draft(model)
    runner = TargetRunner(model, target.layout, draft.config.aux_layer_ids, 64)
    runner.model(input_ids=torch.tensor([[1, 2, 3]]))
    before = runner._cap.aux.clone()
    ids = torch.tensor([[4, 5, 6, 7]])
    copied = copy.deepcopy(model).float()
    copied(input_ids=ids)
    assert runner._cap.aux.shape != before.shape               # the undropped copy wrote into the original
    runner.model(input_ids=torch.tensor([[1, 2, 3]]))
    drop_capture_hooks(copied)(input_ids=ids)
    assert torch.equal(runner._cap.aux, before)
    own = TargetRunner(copied, find_layout(copied), draft.config.aux_layer_ids, 64)   # the copy's own capture
    own.model(input_ids=ids)
    assert own._cap.aux.shape[1] == 4 and torch.equal(runner._cap.aux, before)

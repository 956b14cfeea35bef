"""Compare two `eyas regenerate` outputs of the same rows (e.g. hf vs vllm backends) and report generation speed.

    python bench/regen_compare.py --target T --pair A.jsonl B.jsonl --logs A.log B.log \
        [--throughput BIG.jsonl BIG.log] --out regen.json

Match: per conversation, assistant turns compared in order up to the first different turn (later prompts differ).
At the first differing token of a differing first turn, the target's own logit gap between the two choices is
measured (bf16 target, as both backends ran it): a gap of a few bf16 ulps is a tie that either backend may break
either way. Speed: generated tokens (answers re-tokenized, stop tokens not counted) over the stage's seconds
(the summary JSON each log ends with), with and without the engine's start-up.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from eyas.data.backends import prompt_ids
from eyas.decode.divergence import TIE_ULPS, ulp
from eyas.target import load_target


def rows(path):
    return {r["row"]: r for r in map(json.loads, filter(str.strip, Path(path).read_text(encoding="utf-8").split("\n")))}


def answers(r):
    return [m["content"] for m in r["messages"] if m["role"] == "assistant"]


def summary(log):
    text = Path(log).read_text()  # progress lines, then the summary JSON regenerate prints last
    return json.JSONDecoder().raw_decode(text, text.rindex('{\n  "input"'))[0]


def speed(tok, path, log):
    s, n = summary(log), sum(len(tok(a, add_special_tokens=False)["input_ids"])
                             for r in rows(path).values() for a in answers(r))
    start = s.get("backend_startup_s") or 0.0
    return {"rows": s["input"], "written": s["written"], "failed": s["failed"], "turns": s["turns"],
            "generated_tokens": n, "seconds": s["seconds"], "startup_s": start,
            "tok_s": n / s["seconds"], "tok_s_after_startup": n / (s["seconds"] - start),
            "backend_stats": s.get("backend_stats")}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--pair", nargs=2, required=True)
    ap.add_argument("--logs", nargs=2, required=True)
    ap.add_argument("--throughput", nargs=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    t = load_target(a.target, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    tok, dev = t.tokenizer, next(t.model.parameters()).device
    A, B = rows(a.pair[0]), rows(a.pair[1])
    common = sorted(set(A) & set(B))
    conv_same = turns = turns_same = first_same = 0
    gaps = []
    for i in common:
        xa, xb = answers(A[i]), answers(B[i])
        conv_same += xa == xb
        first_same += xa[:1] == xb[:1]
        for u, v in zip(xa, xb):
            turns += 1
            if u != v:
                break
            turns_same += 1
        if xa[:1] != xb[:1] and len(gaps) < 128:  # where do the first turns part, and is it a tie?
            prompt = prompt_ids(tok, tok.apply_chat_template(A[i]["messages"][:1], tokenize=False,
                                                             add_generation_prompt=True))
            ia, ib = (tok(x[0], add_special_tokens=False)["input_ids"] for x in (xa, xb))
            k = next((j for j, (p, q) in enumerate(zip(ia, ib)) if p != q), min(len(ia), len(ib)))
            if k < min(len(ia), len(ib)):
                with torch.no_grad():
                    logits = t.model(torch.tensor([prompt + ia[:k]], device=dev)).logits[0, -1].float()
                top, la, lb = logits.max(), float(logits[ia[k]]), float(logits[ib[k]])
                u = ulp(max(abs(la), abs(lb)), torch.bfloat16)
                gaps.append({"row": i, "token": k, "gap": la - lb, "ulp": u, "tie": abs(la - lb) <= TIE_ULPS * u,
                             "a_below_top": float(top) - la, "b_below_top": float(top) - lb})
            else:  # one answer is a prefix of the other: a length/stop difference, not a token choice
                gaps.append({"row": i, "token": k, "gap": None, "tie": None, "note": "prefix (eos/length)"})
    # a row one backend dropped (e.g. "empty answer": its greedy first token ends the turn) is not compared; how
    # many there are says whether the backends agree on which rows those are
    out = {"rows_compared": len(common), "rows_only_in_a": sorted(set(A) - set(B))[:32],
           "rows_only_in_b": sorted(set(B) - set(A))[:32], "conversations_identical": conv_same / max(len(common), 1),
           "first_turn_identical": first_same / max(len(common), 1),
           "turns_identical_until_first_difference": f"{turns_same}/{turns}", "first_turn_divergences": gaps,
           "max_abs_gap_at_divergence": max((abs(g["gap"]) for g in gaps if g["gap"] is not None), default=None),
           "divergences_tie": sum(g["tie"] is True for g in gaps),
           "divergences_not_tie": [g["row"] for g in gaps if g["tie"] is False],
           "speed": {"a": speed(tok, a.pair[0], a.logs[0]), "b": speed(tok, a.pair[1], a.logs[1])}}
    if a.throughput:
        out["speed"]["b_big"] = speed(tok, *a.throughput)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "first_turn_divergences"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/faults.py families for who owns an output (eyas.outputs) and for non-finite training.

  collisions   every writing command aimed at something it must not touch: an input, a link to one, another
               command's output, a directory of the user's files (with and without --overwrite)
  resume       a stopped regenerate / extract / train resumed with one setting or input changed
  concurrent   two writers started on one --out (regenerate, train with two seeds, extract)
  non-finite   training that diverges (--lr 100, a target emitting NaN), and a NaN or inf draft given to eval, export,
               doctor

A fault is `detected` when the command refused in one line and what it must not touch is byte for byte as before,
`survived` when it finished with the right result, `lost` when something protected changed, `wrong` when it
finished with a mixed or non-finite result, `traceback` when a user's mistake ended in a traceback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import fault_procs as P
from fault_procs import one_line_error, run_to_end


def snapshot(p: Path) -> dict[str, str]:
    """sha256 of every file under p (or of p), links named by their target, locks left out."""
    p = Path(p)
    if p.is_symlink():
        return {".": "link:" + str(p.readlink())}
    if p.is_file():
        return {".": hashlib.sha256(p.read_bytes()).hexdigest()}
    out = {}
    for f in sorted(p.rglob("*")):
        if f.name.endswith(".lock") or f.is_dir() and not f.is_symlink():
            continue
        out[str(f.relative_to(p))] = "link:" + str(f.readlink()) if f.is_symlink() else \
            hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def judge(tally, family: str, name: str, r: dict, before: dict, after: dict) -> str:
    """The verdict on a run that had to refuse (see the module doc)."""
    if "Traceback" in r["stderr"]:
        verdict = "traceback"
    elif before != after:
        verdict = "lost"
    elif r["rc"] == 0:
        verdict = "wrong"
    else:
        verdict = "detected" if one_line_error(r) else "manual"
    tally.add(family, verdict, f"{name}: rc {r['rc']}: {r['stderr'][-300:]}")
    return verdict


def _finite(files) -> bool:
    from safetensors.torch import load_file
    import torch
    return all(bool(torch.isfinite(v).all()) for f in files for v in load_file(str(f)).values()
               if v.is_floating_point())


def other_weights(target: Path, dst: Path, *, nan: bool = False) -> Path:
    """A copy of `target` with the same config and other weights (or a layer of NaN)."""
    import torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(target, dst)
    w = load_file(str(dst / "model.safetensors"))
    k = next(k for k in sorted(w) if "layers.1." in k and w[k].ndim == 2)
    w[k] = torch.full_like(w[k], float("nan")) if nan else w[k] + 0.01
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def regen_cmd(base: str, data, out: Path, *extra: str) -> list[str]:
    return ["regenerate", "--target", "slow", "--backend", "openai", "--base-url", base, "--data", str(data),
            "--out", str(out), "--concurrency", "4", "--retry-backoff", "0.01", "--request-timeout", "5", "--json",
            *extra]


def scratch(work: Path, name: str, rows: int) -> tuple[Path, Path]:
    """A family's own directory, with `rows` conversations for the fake server in chats.jsonl."""
    from fake_openai import conversations
    root = work / name
    root.mkdir()
    data = root / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in conversations(rows)))
    return root, data


def with_flag(cmd: list[str], flag: str, *values: str) -> list[str]:
    """`cmd` with `flag` set to `values`: its one value replaced where it is given, else appended."""
    if flag in cmd and len(values) == 1:
        i = cmd.index(flag)
        return [*cmd[:i + 1], values[0], *cmd[i + 2:]]
    return [*cmd, flag, *values]


# ---------------------------------------------------------------- collisions
def family_collisions(tally, w, store, run, work: Path, base: str, train_cmd, extract_cmd) -> None:
    root, data = scratch(work, "collide", 12)
    mine = root / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    link = root / "link.jsonl"
    link.symlink_to(data)
    regen_out = root / "regen.jsonl"
    assert run_to_end(regen_cmd(base, data, regen_out), work=work)["rc"] == 0
    lines = regen_out.read_text().splitlines(keepends=True)
    damaged = root / "damaged.jsonl"
    record = regen_out.with_name(regen_out.name + ".eyas-output.json")
    if record.is_file():
        shutil.copy(record, damaged.with_name(damaged.name + ".eyas-output.json"))
    damaged.write_text(lines[0] + "not json\n" + "".join(lines[1:]))
    exp = root / "export"
    assert run_to_end(["export", "--draft", str(run), "--out", str(exp), "--verifier", str(w["target"])],
                      work=work)["rc"] == 0
    bench = root / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["t1 t2 t3"]}) + "\n")
    tgt = shutil.copytree(w["target"], root / "target")
    cases = [
        ("regenerate --out = --data", regen_cmd(base, data, data, "--overwrite"), data),
        ("regenerate --out = a link to --data", regen_cmd(base, data, link), data),
        ("regenerate --out = a foreign JSONL", regen_cmd(base, regen_out, data), data),
        ("regenerate resume over a damaged line", regen_cmd(base, data, damaged), damaged),
        ("prepare --out = the target", ["prepare", "--target", str(tgt), "--data", str(data), "--out", str(tgt),
                                        "--overwrite"], tgt),
        ("prepare --out = the user's dir", ["prepare", "--target", str(tgt), "--data", str(data), "--out",
                                            str(mine)], mine),
        ("extract --out = --data", [*extract_cmd(w, w["prep"]), "--overwrite"], w["prep"]),
        ("extract --out = a training run", extract_cmd(w, run), run),
        ("extract --overwrite into the user's dir", [*extract_cmd(w, mine), "--overwrite"], mine),
        ("train --out = --target", with_flag(train_cmd(w, store, tgt, resume=False), "--target", str(tgt)), tgt),
        ("train --out = its --store", train_cmd(w, store, store, resume=False), store),
        ("train --overwrite into the user's dir", train_cmd(w, store, mine, resume=False), mine),
        ("import --out = a training run", ["import", "--src", str(exp), "--out", str(run)], run),
        ("import --out = --src", ["import", "--src", str(exp), "--out", str(exp), "--overwrite"], exp),
        ("export --out = the run", ["export", "--draft", str(run), "--out", str(run), "--verifier", "t"], run),
        ("export --out = the run's parent", ["export", "--draft", str(run), "--out", str(run.parent)], run),
        ("export --out = the user's dir", ["export", "--draft", str(run), "--out", str(mine), "--overwrite"], mine),
        ("eval --out = --bench", ["eval", "--target", str(tgt), "--draft", str(run), "--bench", str(bench),
                                  "--out", str(bench), "--device", "cpu", "--overwrite"], bench),
        ("eval --out = a foreign file", ["eval", "--target", str(tgt), "--draft", str(run), "--bench", str(bench),
                                         "--out", str(mine / "thesis.txt"), "--device", "cpu"], mine),
        ("demo --out = the user's dir", ["demo", "--out", str(mine)], mine),
        ("serve-check --out = a foreign file", ["serve-check", "--draft", str(exp), "--out",
                                                str(mine / "thesis.txt")], mine),
    ]
    for name, cmd, protected in cases:
        before = snapshot(protected)
        r = run_to_end(cmd, work=work)
        judge(tally, "collisions", name, r, before, snapshot(protected))


# ---------------------------------------------------------------- resume with other settings
def family_resume(tally, w, store, run, work: Path, base: str, train_cmd, extract_cmd) -> None:
    root, data = scratch(work, "resume", 24)
    src = root / "answers.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {
        "role": "assistant", "content": " ".join(["word"] * 60)}]}) + "\n" for i in range(6)))
    other = other_weights(Path(w["target"]), root / "other-target")

    def partial_regen(tag: str, d=data) -> Path:
        out = root / f"{tag}.jsonl"
        assert run_to_end(regen_cmd(base, d, out, "--max-samples", "4"), work=work)["rc"] == 0
        return out

    for change in (["--temperature", "0.7"], ["--max-new-tokens", "64"], ["--seed", "5"], ["--top-p", "0.5"],
                   ["--target", "ok"]):
        out = partial_regen("regen" + change[0])
        before = snapshot(out)
        r = run_to_end(with_flag(regen_cmd(base, data, out), *change), work=work)
        judge(tally, "resume", f"regenerate resumed with {' '.join(change)}", r, before, snapshot(out))
    out = partial_regen("tasks", f"tasks:{src}")
    before = snapshot(out)
    r = run_to_end(regen_cmd(base, f"tasks:{src}", out, "--task-min-words", "80"), work=work)
    judge(tally, "resume", "regenerate tasks: resumed with --task-min-words 80", r, before, snapshot(out))
    out = partial_regen("same")                                    # the control: the same settings resume
    r = run_to_end(regen_cmd(base, data, out), work=work)
    rows = [json.loads(x)["row"] for x in out.read_text().splitlines()]
    tally.add("resume", "survived" if r["rc"] == 0 and sorted(rows) == list(range(24)) else "wrong",
              f"regenerate resumed alike: rc {r['rc']} rows {sorted(rows)[:5]}")

    for change in (["--warmup-steps", "3"], ["--min-lr-ratio", "0.5"], ["--weight-decay", "0.5"], ["--lr", "2e-4"],
                   ["--target", str(other)]):
        r_dir = shutil.copytree(run, root / f"run{change[0]}")
        before = snapshot(r_dir)
        cmd = with_flag(train_cmd(w, store, r_dir, resume=True), *change)
        judge(tally, "resume", f"train --resume with {change[0]} {Path(change[1]).name}", run_to_end(cmd, work=work),
              before, snapshot(r_dir))

    for change in (["--store-dtype", "fp8"], ["--aux-layer-ids", "1", "2", "3"], ["--target", str(other)]):
        s = shutil.copytree(store, root / f"store{change[0]}", symlinks=True)
        (s / "manifest.json").unlink()                          # a stopped extraction
        for f in sorted(s.glob("shard-*.safetensors"))[-2:]:
            f.unlink()
        before = snapshot(s)
        cmd = with_flag(extract_cmd(w, s), *change)
        judge(tally, "resume", f"extract resumed with {change[0]} {Path(change[1]).name}", run_to_end(cmd, work=work),
              before, snapshot(s))


# ---------------------------------------------------------------- two writers at once
def _second_writer(tally, name: str, cmd_a, cmd_b, started, work: Path, check) -> None:
    a = P.FORKER.spawn(cmd_a, {}, work)
    t0 = time.monotonic()
    while not started() and a.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.02)
    rb = P.FORKER.spawn(cmd_b, {}, work).result()
    ra = a.result()
    ok, note = check()
    if "Traceback" in ra["stderr"] + rb["stderr"]:
        verdict = "traceback"
    elif not ok:
        verdict = "wrong" if ra["rc"] == rb["rc"] == 0 else "lost"
    elif ra["rc"] == 0 and rb["rc"] != 0 and one_line_error(rb):
        verdict = "detected"
    elif ra["rc"] == 0 and rb["rc"] == 0:
        verdict = "survived"                                    # the second came after the first had finished
    else:
        verdict = "manual"
    tally.add("concurrent", verdict, f"{name}: rc {ra['rc']}/{rb['rc']} {note} {rb['stderr'][-200:]}")


def family_concurrent(tally, w, store, work: Path, base: str, train_cmd, extract_cmd, check_regenerated) -> None:
    root, data = scratch(work, "concurrent", 120)
    for i in range(3):
        out = root / f"regen-{i}.jsonl"
        _second_writer(tally, f"regenerate x2 ({i})", regen_cmd(base, data, out), regen_cmd(base, data, out),
                       lambda: out.is_file() and out.stat().st_size > 0, work,
                       lambda: (lambda v: (v[0] == "survived", v[1]))(check_regenerated(out, 120)))
    for i in range(3):
        out = root / f"run-{i}"

        def no_dup(out=out):
            recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
            keys = [(m["split"], m["step"]) for m in recs]
            return len(keys) == len(set(keys)) and max(k[1] for k in keys) == 24, f"{len(keys)} log lines"
        a = train_cmd(w, store, out, resume=False)
        b = with_flag(a, "--seed", "7")
        _second_writer(tally, f"train x2, seeds 0 and 7 ({i})", a, b, lambda out=out: (out / "metrics.jsonl").is_file(),
                       work, no_dup)
    for i in range(2):
        out = root / f"store-{i}"

        def whole(out=out):
            from eyas.store import verify_store
            return verify_store(out) == [], "verify_store"
        _second_writer(tally, f"extract x2 ({i})", extract_cmd(w, out), extract_cmd(w, out),
                       lambda out=out: any(out.glob("shard-*")), work, whole)


# ---------------------------------------------------------------- non-finite training and drafts
def family_nonfinite(tally, w, store, run, work: Path, train_cmd) -> None:
    root = work / "nonfinite"
    root.mkdir()
    for name, cmd, out in [
        ("train --lr 100", None, root / "lr100"),
        ("train --lr 1e30", None, root / "lr1e30"),
        ("train online on a target emitting NaN", None, root / "nan-target"),
    ]:
        if name.startswith("train online"):
            t = other_weights(Path(w["target"]), root / "nan-target-dir", nan=True)
            cmd = ["train", "--target", str(t), "--data", str(w["prep"]), "--online", "--out", str(out), "--steps",
                   "6", "--save-every", "2", "--eval-every", "2", "--batch-size", "2", "--ttt-steps", "2",
                   "--no-progress", "--no-tensorboard", "--device", "cpu"]
        else:
            cmd = with_flag(with_flag(train_cmd(w, store, out, resume=False), "--steps", "12"), "--lr",
                            name.split()[-1])
        r = run_to_end(cmd, work=work)
        saved = [out / "model.safetensors", *out.glob("checkpoints/*/model.safetensors")]
        saved = [f for f in saved if f.is_file()]
        if "Traceback" in r["stderr"]:
            verdict = "traceback"
        elif not _finite(saved):
            verdict = "wrong"
        elif r["rc"] == 0:
            verdict = "survived"
        else:
            verdict = "detected" if one_line_error(r) and "diverged" in r["stderr"] else "manual"
        tally.add("non-finite", verdict, f"{name}: rc {r['rc']}: {r['stderr'][-300:]}")

    from safetensors.torch import load_file, save_file
    bad = shutil.copytree(run, root / "nan-draft")
    sd = load_file(str(bad / "model.safetensors"))
    sd["fc.weight"] = sd["fc.weight"].clone()
    sd["fc.weight"][0, 0] = float("nan")
    save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
    inf = shutil.copytree(run, root / "inf-draft")   # inf, not NaN: a norm weight overflowed
    sd = load_file(str(inf / "model.safetensors"))
    key = next(k for k in sd if k.endswith("norm.weight"))
    sd[key] = sd[key].clone()
    sd[key][-1] = float("inf")
    save_file(sd, str(inf / "model.safetensors"), metadata={"format": "pt"})
    bench = root / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["t1 t2 t3"]}) + "\n")
    for name, cmd, marker in [
        ("eval of a draft holding inf", ["eval", "--target", str(w["target"]), "--draft", str(inf), "--bench",
                                         str(bench), "--device", "cpu", "--max-new-tokens", "4"], "inf"),
        ("doctor on a draft holding inf", ["doctor", "--target", str(w["target"]), "--draft", str(inf)], "inf"),
        ("eval of a NaN draft", ["eval", "--target", str(w["target"]), "--draft", str(bad), "--bench", str(bench),
                                 "--device", "cpu", "--max-new-tokens", "4"], "NaN"),
        ("export of a NaN draft", ["export", "--draft", str(bad), "--out", str(root / "exp"), "--verifier", "t"],
         "NaN"),
        ("doctor on a NaN draft", ["doctor", "--target", str(w["target"]), "--draft", str(bad)], "NaN"),
    ]:
        r = run_to_end(cmd, work=work)
        said = marker in r["stderr"] + r["stdout"]
        tally.add("non-finite", "traceback" if "Traceback" in r["stderr"] else
                  "detected" if r["rc"] != 0 and said else "wrong", f"{name}: rc {r['rc']}: {r['stderr'][-300:]}")

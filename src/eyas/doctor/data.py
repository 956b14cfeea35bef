"""The chat template and the data: the loss mask of a probe chat, the stop ids against the template's end-of-turn
tokens, then a sample of the conversations or a PREPARED dir (schema, target, draft-vocab coverage)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from eyas.data import MaskError, PreparedDataset, iter_conversations, render_with_mask
from eyas.data.dataset import MANIFEST as PREPARED_MANIFEST
from eyas.data.masks import template_hash
from eyas.doctor.config import Check, DoctorConfig
from eyas.doctor.target import TargetFacts
from eyas.store.extract import data_fingerprint
from eyas.target import load_tokenizer
from eyas.target.load import load_special_ids
from eyas.vocab import check_draft_vocab


PROBE_CHAT = [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "What is two plus two?"},
              {"role": "assistant", "content": "Two plus two is four."},
              {"role": "user", "content": "And three plus three?"},
              {"role": "assistant", "content": "Three plus three is six."}]


def check_template(cfg: DoctorConfig, facts: TargetFacts, out: list[Check]):
    try:
        tok = load_tokenizer(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code)
    except Exception as e:  # noqa: BLE001
        out.append(Check("tokenizer", "fail", f"{cfg.target}: {type(e).__name__}: {e}",
                         "add the tokenizer files to the target dir"))
        return None
    if len(tok) > facts.vocab_size:
        out.append(Check("tokenizer", "fail", f"tokenizer has {len(tok)} tokens, the target's vocab {facts.vocab_size}",
                         "use the target's own tokenizer"))
    if cfg.chat_template:
        tok.chat_template = Path(cfg.chat_template).read_text()
    src = f"--chat-template {cfg.chat_template}" if cfg.chat_template else "the tokenizer's chat template"
    try:
        ids, mask = render_with_mask(tok, PROBE_CHAT)
    except MaskError as e:
        out.append(Check("chat template / loss mask", "fail", f"{src}: {e}",
                         "use a template that renders every assistant turn verbatim (or pass --chat-template)"))
        return tok
    n = int(mask.sum())
    out.append(Check("chat template / loss mask", "pass" if n else "fail",
                     f"{src}: {n}/{len(ids)} tokens of a 2-turn chat are assistant targets" if n else
                     f"{src}: the loss mask is empty (no assistant tokens)",
                     "" if n else "use a template that renders the assistant turns"))
    check_stops(cfg, tok, ids, mask, out)
    return tok


def check_stops(cfg: DoctorConfig, tok, ids, mask, out: list[Check]) -> None:
    """The ids every stage stops on (eyas.target.special) against the template's assistant end-of-turn tokens
    (each masked run's last token) and the tokenizer's own eos (what chat templates and engines call eos)."""
    try:
        stop = load_special_ids(cfg.target, cache=cfg.cache_dir, trust_remote_code=cfg.trust_remote_code).stop
    except ValueError as e:
        out.append(Check("stop tokens", "fail", str(e), "fix generation_config.json"))
        return
    m = mask.tolist()
    ends = sorted({int(ids[i]) for i in range(len(m)) if m[i] and (i + 1 == len(m) or not m[i + 1])})
    name = lambda i: f"{i} {tok.convert_ids_to_tokens(int(i))!r}"  # noqa: E731
    problems = [f"the template ends assistant turns with {name(i)}, which is no stop id" for i in ends
                if i not in stop]
    if tok.eos_token_id is not None and tok.eos_token_id not in stop:
        problems.append(f"the tokenizer's eos is {name(tok.eos_token_id)}, not a stop id (templates using "
                        "eos_token render it)")
    what = (f"stops on {', '.join(name(i) for i in stop)} (config / generation_config.json)" if stop else
            "no eos_token_id in the config or generation_config.json: only the length stops generation")
    out.append(Check("stop tokens", "warn" if problems or not stop else "pass", "; ".join([what] + problems),
                     "set eos_token_id in generation_config.json (or re-convert a GGUF target with this eyas)"
                     if problems or not stop else ""))


def check_data(cfg: DoctorConfig, facts: TargetFacts, tok, out: list[Check]) -> dict | None:
    path = Path(str(cfg.data)).expanduser()
    if (path / PREPARED_MANIFEST).is_file():
        return check_prepared(path, facts, tok, out)
    try:
        records = list(iter_conversations(cfg.data, limit=cfg.mask_rows * 4, cache=cfg.cache_dir))
    except (OSError, ValueError) as e:
        out.append(Check("dataset schema", "fail", f"{cfg.data}: {e}", "pass a conversations file, a built-in "
                         "dataset name or a PREPARED dir"))
        return None
    ok = [r for r in records if r.ok]
    rejects = Counter(r.category for r in records if not r.ok)
    out.append(Check("dataset schema", "fail" if not ok else "warn" if len(ok) < len(records) / 2 else "pass",
                     f"{len(ok)}/{len(records)} sampled rows usable"
                     + (f"; rejects {dict(rejects)}" if rejects else ""),
                     "rows need [{role, content}] messages (or ShareGPT from/value) with assistant turns"))
    if tok is None or not ok:
        return None
    fails, n_ok = Counter(), 0
    for r in ok[:cfg.mask_rows]:
        if r.messages is None:
            continue  # plain-text rows have no template to validate
        try:
            n_ok += bool(render_with_mask(tok, r.messages)[1].any())
        except MaskError as e:
            fails[str(e).split(":", 1)[0]] += 1
    total = n_ok + sum(fails.values())
    status = "pass" if not fails else "fail" if n_ok == 0 else "warn"
    out.append(Check("loss mask on data", status, f"{n_ok}/{total} rendered rows have a valid assistant mask"
                     + (f"; failures {dict(fails)}" if fails else ""), "check the chat template against these rows"))
    return None


def check_prepared(path: Path, facts: TargetFacts, tok, out: list[Check]) -> dict | None:
    try:
        ds = PreparedDataset(path, verify=True)  # a flipped byte in a rows shard must fail here, not train
        m = ds.manifest
        d2t, t2d = ds.vocab()
        freq = ds.freq()
    except (OSError, ValueError, KeyError) as e:
        out.append(Check("dataset schema", "fail", f"{path}: {e}", "re-run `eyas prepare`"))
        return None
    bad = []
    if m["target"].get("vocab_size") not in (None, facts.vocab_size):
        bad.append(f"prepared for vocab {m['target']['vocab_size']}, target has {facts.vocab_size}")
    want = m["target"].get("chat_template_sha256")
    if want and tok is not None and getattr(tok, "chat_template", None) and template_hash(tok) != want:
        bad.append("prepared with a different chat template than the target's tokenizer has")
    out.append(Check("dataset schema", "fail" if bad else "pass", "; ".join(bad) or
                     f"PREPARED {path.name}: {len(ds)} rows, max_length {m['max_length']}",
                     "re-run `eyas prepare` with this target" if bad else ""))
    problems = check_draft_vocab(d2t, t2d, vocab_size=facts.vocab_size)
    total = int(freq.sum())
    coverage = float(freq[t2d].sum()) / total if total and freq.numel() == t2d.numel() else 0.0
    status = "fail" if problems else "warn" if coverage < 0.9 else "pass"
    out.append(Check("draft vocab coverage", status, "; ".join(problems) or
                     f"{d2t.numel()} draft tokens cover {coverage:.1%} of assistant tokens",
                     "re-run `eyas prepare`" if problems else "raise --draft-vocab-size in `eyas prepare`"))
    return {"draft_vocab_size": int(d2t.numel()), "tokens": int(m["summary"].get("tokens") or 0) or None,
            "fingerprint": data_fingerprint(ds)}

"""Checks of a GGUF conversion against the references: eyas's header parse against `gguf.GGUFReader`'s, and
a converted directory against what transformers itself builds from the GGUF (config dicts, tokenizer files
byte for byte, encode/decode/chat-template output over a few hundred varied strings), the reference tokenizer's
bos/eos/pad set to the GGUF's ids as the converter sets them (target/special.py).

bench/convert.py runs them on the real files (on the GPU machine's transformers as well as here) and the tests
on tiny GGUFs. The references parse the GGUF again (slow: seconds to a minute for a real file).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

# What transformers' config holds that depends on where it was read from, not on the model
CONFIG_IGNORED = {"_name_or_path", "transformers_version"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

_SNIPPETS = [
    "Hello, world!", "hello world", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "import numpy as np\nx = np.arange(10).reshape(2, 5)  # comment",
    "<div class=\"main\">&nbsp;</div>", "{\"key\": [1, 2.5, -3e10, null, true]}",
    "The quick brown fox jumps over the lazy dog.", "I'm sure it's what they'd've wanted, isn't it?",
    "日本語のテキストです。", "中文分词测试：你好，世界！", "한국어 문장입니다.", "Ünïcödé àccénts — “quotes” ‘single’",
    "emoji 😀🎉👍🏽 and 👨‍👩‍👧‍👦 family", "math: ∑_{i=1}^{n} i² = n(n+1)(2n+1)/6", "Ελληνικά και русский текст",
    "numbers 1234567890 3.14159 -0.001 1e-9 0x1F", "URL https://example.com/path?q=1&r=two#frag",
    "a" * 50, "ab " * 30, "\n\n\n", " ", "", "   \t  ", "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE", "العربية من اليمين إلى اليسار",
    "mixed 中文 English 日本 한국 emoji 🚀 code `x += 1`", "\u200bzero\u200bwidth\u200b", "tab\tseparated\tvalues",
]


def sample_texts(special: list[str] | None = None) -> list[str]:
    """A few hundred strings: code, prose, CJK, emoji, whitespace runs, and the tokenizer's special tokens inside
    text; deterministic."""
    texts = list(_SNIPPETS)
    texts += [" " + s for s in _SNIPPETS] + [s + "\n" for s in _SNIPPETS]
    texts += [a + " " + b for a, b in zip(_SNIPPETS, _SNIPPETS[1:] + _SNIPPETS[:1])]
    texts += [s.upper() for s in _SNIPPETS] + [s[::-1] for s in _SNIPPETS]
    for i, tok in enumerate(special or []):
        s = _SNIPPETS[i % len(_SNIPPETS)]
        texts += [tok, f"{tok}{s}", f"{s} {tok} {s}", f"{tok}\n{tok}"]
    return texts


CONVERSATIONS = [
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Translate 'good morning' into 日本語."},
     {"role": "assistant", "content": "おはようございます 🌅"},
     {"role": "user", "content": "And into Chinese?"}],
]


def header_differences(gguf: Path) -> list[str]:
    """Where eyas's header parse differs from `gguf.GGUFReader`'s: every key's value and type chain, the
    alignment and data offset, every tensor's name, type, shape, offset and size. Empty when equal."""
    import numpy as np
    from gguf import GGUFReader

    from eyas.target.gguf_header import read_header

    h, reader = read_header(gguf), GGUFReader(str(gguf))
    problems = []
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]   # the reader lists the header's counts too
    if keys != list(h.metadata):
        problems.append(f"keys differ: {sorted(set(keys) ^ set(h.metadata))[:5]} (or their order)")
    for k in keys:
        f, ours = reader.fields[k], h.metadata.get(k)
        ours = ours.tolist() if isinstance(ours, np.ndarray) else ours
        if tuple(int(x) for x in f.types) != h.types.get(k):
            problems.append(f"key {k}: type {[int(x) for x in f.types]} vs {h.types.get(k)}")
        elif f.contents() != ours:
            problems.append(f"key {k}: value {str(f.contents())[:60]} vs {str(ours)[:60]}")
    if (reader.alignment, reader.data_offset) != (h.alignment, h.data_offset):
        problems.append(f"alignment, data offset {(reader.alignment, reader.data_offset)} vs "
                        f"{(h.alignment, h.data_offset)}")
    ref = [(t.name, t.tensor_type, tuple(reversed([int(x) for x in t.shape])), int(t.data_offset), int(t.n_bytes))
           for t in reader.tensors]
    ours_t = [(t.name, t.qtype, t.shape, t.offset, t.nbytes) for t in h.tensors]
    if len(ref) != len(ours_t):
        problems.append(f"{len(ref)} tensors vs {len(ours_t)}")
    problems += [f"tensor {a[0]}: {a[1:]} vs {b[1:]}" for a, b in zip(ref, ours_t) if a != b]
    return problems


def config_differences(gguf: Path, hf_dir: Path) -> dict[str, tuple]:
    """{key: (transformers' value, the dir's)} for every config key that differs, CONFIG_IGNORED aside."""
    from transformers import AutoConfig

    gguf = Path(gguf)
    ref = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    ours = AutoConfig.from_pretrained(str(hf_dir)).to_dict()
    # set on the written config on purpose (target/gguf_convert.as_checkpoint_config): not read from the GGUF
    for k in ("dtype", "architectures", "quantization_config"):
        ref.pop(k, None)
        ours.pop(k, None)
    keys = (set(ref) | set(ours)) - CONFIG_IGNORED
    missing = object()
    return {k: (ref.get(k), ours.get(k)) for k in sorted(keys) if ref.get(k, missing) != ours.get(k, missing)}


def tokenizer_differences(gguf: Path, hf_dir: Path, texts: list[str] | None = None) -> dict:
    """transformers' own GGUF tokenizer against the one saved in `hf_dir`: which saved files differ, and how many
    texts encode, decode or render a chat differently (with the first such text)."""
    from transformers import AutoTokenizer

    from eyas.target.gguf_header import read_header
    from eyas.target.gguf_meta import gguf_special_ids
    from eyas.target.special import align_tokenizer, tokenizer_roles

    gguf = Path(gguf)
    ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the one change eyas makes on purpose: bos/eos/pad name the GGUF's ids (transformers' own roles are reported)
    transformers_roles = tokenizer_roles(ref)
    align_tokenizer(ref, gguf_special_ids(read_header(gguf)))
    ours = AutoTokenizer.from_pretrained(str(hf_dir))
    with tempfile.TemporaryDirectory(prefix="eyas-gguf-verify-") as tmp:
        ref.save_pretrained(tmp)
        files = [f for f in TOKENIZER_FILES if _read(Path(tmp) / f) != _read(Path(hf_dir) / f)]
    special = sorted(set(ref.all_special_tokens) | {str(t) for t in ref.added_tokens_decoder.values()})
    texts = sample_texts(special) if texts is None else texts
    mismatched = []
    for text in texts:
        a, b = ref(text)["input_ids"], ours(text)["input_ids"]
        if a != b or any(ref.decode(a, skip_special_tokens=s) != ours.decode(b, skip_special_tokens=s)
                         for s in (False, True)):
            mismatched.append({"text": text, "transformers": a, "converted": b})
    chats = 0
    if ref.chat_template:
        for conv in CONVERSATIONS:
            for gen in (False, True):
                a = ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
                b = ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
                if a != b or ref(a)["input_ids"] != ours(b)["input_ids"]:
                    mismatched.append({"chat": conv, "transformers": a, "converted": b})
                chats += 1
    return {"class": [type(ref).__name__, type(ours).__name__], "files_differ": files, "texts": len(texts),
            "roles": tokenizer_roles(ours), "transformers_roles": transformers_roles,
            "chats": chats, "mismatched": len(mismatched), "first_mismatch": mismatched[0] if mismatched else None,
            "equal": not files and not mismatched and type(ref) is type(ours)}


def _read(p: Path) -> bytes | None:
    return p.read_bytes() if p.is_file() else None


def verify(gguf: Path, hf_dir: Path) -> dict:
    """Both checks, JSON-ready."""
    config = config_differences(gguf, hf_dir)
    tokenizer = tokenizer_differences(gguf, hf_dir)
    return {"config_differences": json.loads(json.dumps(config, default=str)), "tokenizer": tokenizer,
            "equal": not config and tokenizer["equal"]}

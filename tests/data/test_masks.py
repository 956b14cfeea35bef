"""Assistant-only loss masks for real template styles, derived without knowing the template."""

from __future__ import annotations


import pytest
import torch

from eyas.data import MaskError, render_with_mask
from tests.data.templates import SPECIALS, STYLES, make_tokenizer

SYSTEM = {"role": "system", "content": "You are terse."}
CHAT = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hello! How can I help you today?"},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "  2 + 2 = 4.\nThe answer is four.\n"},  # template whitespace at both ends
]


def runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """Contiguous [start, end) runs of True."""
    out, start = [], None
    for i, m in enumerate(mask.tolist() + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def norm(s: str) -> str:
    return " ".join(s.split())


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("system", [False, True])
def test_mask_is_exactly_assistant_content_plus_end_of_turn(style, system):
    tok = make_tokenizer(style)
    eot = STYLES[style][1]
    msgs = ([SYSTEM] if system else []) + CHAT
    ids, mask = render_with_mask(tok, msgs)
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool and ids.shape == mask.shape
    # the ids are the template's own rendering, tokenized as transformers does it
    ref = tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    assert ids.tolist() == ref
    spans = runs(mask)
    answers = [m["content"] for m in msgs if m["role"] == "assistant"]
    assert len(spans) == len(answers), "one masked run per assistant turn"
    for (a, b), content in zip(spans, answers):
        assert tok.convert_ids_to_tokens(int(ids[b - 1])) == eot, "each run ends with the end-of-turn token"
        body = tok.decode(ids[a:b - 1].tolist())
        assert norm(body) == norm(content)
    unmasked = tok.decode(ids[~mask].tolist())
    assert "Hello there" in unmasked and "What is 2 + 2?" in unmasked
    if system:
        assert "You are terse." in unmasked
    assert "How can I help" not in unmasked and "four" not in unmasked


def test_no_shift_mask_marks_the_assistant_tokens_themselves():
    tok = make_tokenizer("smollm2")
    ids, mask = render_with_mask(tok, CHAT[:2])
    first = int(mask.nonzero()[0])
    assert tok.decode(ids[first:first + 1].tolist()).startswith("H")  # 'Hello', not the newline before it
    assert tok.decode(ids[first - 1:first].tolist()) == "\n"


def test_template_that_refuses_system_is_a_template_error():
    tok = make_tokenizer("gemma2")
    with pytest.raises(MaskError, match="^template_error: .*System role not supported"):
        render_with_mask(tok, [SYSTEM] + CHAT)
    ids, mask = render_with_mask(tok, CHAT)  # the same template without a system turn works
    assert len(runs(mask)) == 2


def test_template_that_rewrites_history_is_rejected():
    tok = make_tokenizer("smollm2", template="{{ messages|length }} turns\n" + STYLES["smollm2"][0])
    with pytest.raises(MaskError, match="^template_unstable"):
        render_with_mask(tok, CHAT)


def test_template_that_alters_content_is_rejected():
    tpl = STYLES["smollm2"][0].replace("message['content']", "message['content'] | upper")
    with pytest.raises(MaskError, match="^content_not_found"):
        render_with_mask(make_tokenizer("smollm2", template=tpl), CHAT)


def test_special_token_inside_an_answer_is_rejected():
    msgs = [CHAT[0], {"role": "assistant", "content": "sure<|im_end|> and more"}]
    with pytest.raises(MaskError, match="^special_token_in_content"):
        render_with_mask(make_tokenizer("smollm2"), msgs)


def test_unknown_characters_fail_validation():
    # a WordLevel tokenizer maps unseen words to <unk>: the decoded mask cannot match the content
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system", "hi",
                                         "\n", "ok"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("\n", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    with pytest.raises(MaskError, match="^mask_mismatch"):
        render_with_mask(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "never seen"}])


def test_missing_template_is_a_clear_error():
    tok = make_tokenizer("smollm2")
    tok.chat_template = None
    with pytest.raises(MaskError, match="^template_missing"):
        render_with_mask(tok, CHAT)


@pytest.mark.slow
@pytest.mark.parametrize("style", list(STYLES))
def test_real_smollm2_tokenizer_with_each_template(style):
    from eyas.target import load_tokenizer

    tok = load_tokenizer("smollm2-135m")  # the built-in target: fetched with pip once, then cached
    tok.add_special_tokens({"additional_special_tokens": [s for s in SPECIALS if s not in tok.get_vocab()]})
    tok.chat_template = STYLES[style][0]
    if style in ("llama3", "gemma3"):
        tok.bos_token = {"llama3": "<|begin_of_text|>", "gemma3": "<bos>"}[style]
    msgs = [SYSTEM] + CHAT
    ids, mask = render_with_mask(tok, msgs)
    spans = runs(mask)
    assert len(spans) == 2
    for (a, b), m in zip(spans, [CHAT[1], CHAT[3]]):
        assert tok.convert_ids_to_tokens(int(ids[b - 1])) == STYLES[style][1]
        assert norm(tok.decode(ids[a:b - 1].tolist())) == norm(m["content"])


TRICKY = ["\u200b zero width first", "日本語の答え", "🙂 emoji", "é", "tabs\tand  double  spaces ", "x\u200b"]


def both_paths_agree(tok):
    from eyas.data.masks import ChatRenderer

    chats = [[{"role": "user", "content": "q"}, {"role": "assistant", "content": c}] for c in TRICKY]
    fast, slow = ChatRenderer(tok), ChatRenderer(tok)
    slow.backend = None  # the offset-mapping path every fast tokenizer supports through transformers
    for c, a, b in zip(TRICKY, fast.masks(chats), slow.masks(chats)):
        assert not isinstance(a, Exception), (c, a)
        assert not isinstance(b, Exception), (c, b)
        assert torch.equal(torch.as_tensor(a[0]), torch.as_tensor(b[0]))
        assert torch.equal(torch.as_tensor(a[1]), torch.as_tensor(b[1])), c


def test_multibyte_characters_split_over_tokens():
    both_paths_agree(make_tokenizer("smollm2"))


@pytest.mark.slow
def test_multibyte_characters_real_smollm2():
    from eyas.target import load_tokenizer

    both_paths_agree(load_tokenizer("smollm2-135m"))

"""In-memory stand-ins for a PREPARED dataset and a STORE, built from a tiny random Llama target.

They follow the documented reader interfaces (eyas.data.PreparedDataset / eyas.store.HiddenStateStore):
`len`, `[i] -> row dict`, `.manifest`, and `.vocab()` for the prepared one.
"""

from __future__ import annotations

import torch
import transformers as tf

from eyas.target import target_states, wrap_model
from eyas.vocab import build_draft_vocab

VOCAB, HIDDEN, LAYERS = 96, 32, 4
AUX = [0, 2, 3]


def tiny_target(seed: int = 0, hidden: int = HIDDEN):
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg).eval().requires_grad_(False)
    # Random init gives near-uniform next-token distributions; a sharper head makes argmax agreement a
    # meaningful signal (as it is for trained LMs) without changing anything structural.
    model.lm_head.weight.mul_(20.0)
    return wrap_model(model, name="tiny-llama")


def make_rows(n: int, length: int = 24, seed: int = 0, docs: int = 2) -> list[dict]:
    """Packed rows of `docs` documents each; the second half of every document is 'assistant'."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        L = length - (i % 3)            # ragged lengths exercise padding
        cuts = sorted(torch.randperm(L - 4, generator=g)[:docs - 1].add(2).tolist())
        bounds = [0, *cuts, L]
        pos, mask = [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            pos += list(range(b - a))
            mask += [j >= (b - a) // 2 for j in range(b - a)]
        # Low-entropy tokens (a few repeating patterns) so a tiny draft can fit them.
        ids = torch.randint(0, VOCAB, (L,), generator=g)
        rows.append({"input_ids": ids, "loss_mask": torch.tensor(mask), "position_ids": torch.tensor(pos)})
    return rows


def vocab_for(rows: list[dict], size: int):
    freq = torch.zeros(VOCAB, dtype=torch.long)
    for r in rows:
        freq.index_add_(0, r["input_ids"], torch.ones_like(r["input_ids"]))
    return build_draft_vocab(freq, size)[:2]


class FakePrepared:
    def __init__(self, rows, d2t, t2d):
        self.rows, self._vocab = rows, (d2t, t2d)
        self.manifest = {"format": "eyas-prepared", "target": "tiny-llama"}

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return dict(self.rows[i])

    def vocab(self):
        return self._vocab


class FakeStore:
    """Rows + target states computed one row at a time (as an extractor would)."""

    def __init__(self, rows, target, aux_ids=AUX, dtype=torch.float32):
        self.items = []
        for r in rows:
            aux, last, _ = target_states(target.model, target.layout, r["input_ids"][None], aux_ids,
                                         position_ids=r["position_ids"][None])
            self.items.append({**r, "aux": aux[0].to(dtype).float(), "last": last[0].to(dtype).float()})
        self.manifest = {"format": "eyas-store", "target": {"name": "tiny-llama", "aux_layer_ids": list(aux_ids)}}

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return dict(self.items[i])


def save_tiny_target(path, layers: int = 4, seed: int = 0):
    """A tiny Llama + word-level tokenizer on disk (load_target loads both)."""
    from tokenizers import Tokenizer, models

    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    tf.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(path)
    return path

"""A tiny random Llama target saved as an HF dir, and an eyas draft trained for it (random weights that
are spread out enough that any wrong key, norm or layer id changes the logits visibly)."""

from __future__ import annotations

import torch
import transformers as tf

from eyas.draft.model import Eagle3Draft, draft_config_from_target

V, H, L = 96, 32, 8


def make_target_dir(path):
    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=L,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, rope_theta=5000.0)
    torch.manual_seed(1)
    model = tf.LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(path)
    return path, model


def make_draft(target_model, *, aux=(2, 4, 5), draft_vocab=64, norm_before_residual=True, seed=0):
    torch.manual_seed(seed)
    dc = draft_config_from_target(target_model.config, aux_layer_ids=list(aux), draft_vocab_size=draft_vocab,
                                  norm_before_residual=norm_before_residual)
    d = Eagle3Draft(dc).float().eval()
    with torch.no_grad():
        for n, p in d.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
            elif "norm" in n:
                p.uniform_(0.5, 1.5)  # non-trivial norms: dropping one must change the output
        ids = torch.randperm(V)[:draft_vocab].sort().values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        d.set_vocab_map(ids - torch.arange(draft_vocab), t2d)
        d.init_from_target(target_model.get_input_embeddings().weight)
    return d


def draft_logits(model: Eagle3Draft, seed: int = 3) -> torch.Tensor:
    """Two chained draft steps from fixed random aux states: exercises fc, every norm, attention with
    a cache, the MLP and the head."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    B, T = 2, 5
    aux = torch.randn(B, T, cfg.num_aux, cfg.target_hidden_size, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    pos = torch.arange(T)[None].expand(B, T)
    with torch.no_grad():
        pre, kv = model(ids, model.combine(aux), pos)
        nxt = torch.randint(0, cfg.vocab_size, (B, 1), generator=g)
        mask = torch.ones(1, 1, 1, T + 1, dtype=torch.bool)
        pre2, _ = model(nxt, pre[:, -1:], torch.full((B, 1), T), mask=mask, past=kv)
        return torch.cat([model.logits(pre), model.logits(pre2)], dim=1)

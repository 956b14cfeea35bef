"""One definition of the TTT step weights: the logged objective equals the loss the optimizer sees."""

import torch

from eyas.draft.model import Eagle3Draft, draft_config_from_target
from eyas.train.ttt import TTTUnroll, objective, step_weights, token_loss
from tests.train.fakes import AUX, tiny_target


def test_logged_objective_is_the_training_loss():
    cfg = draft_config_from_target(tiny_target().config, aux_layer_ids=AUX)
    draft = Eagle3Draft(cfg)
    B, T = 2, 16
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    pos = torch.cat([torch.arange(9), torch.arange(7)]).expand(B, T).clone()
    aux = torch.randn(B, T, len(AUX), cfg.target_hidden_size)
    probs = torch.softmax(torch.randn(B, T, cfg.draft_vocab_size), -1)
    ok, lm = torch.ones(B, T, dtype=torch.bool), torch.ones(B, T, dtype=torch.bool)
    with torch.no_grad():
        loss, stats = TTTUnroll(draft, 3, decay=0.7)(ids, pos, lm, aux, probs, ok, probs.argmax(-1))
    assert step_weights(0.7, 3) == [1.0, 0.7, 0.7 ** 2]
    assert abs(objective(stats, 0.7) - float(loss)) < 1e-5
    assert abs(token_loss(stats) - float(stats[:, 0].sum() / stats[:, 2].sum())) < 1e-6
    assert objective(stats, 0.7) != objective(stats, 0.8)        # the decay is really applied

"""A randomly initialised eyas draft for a target (shapes only: the default aux layers, a draft vocabulary of the
first N ids), for probes that need a draft of the real shapes but not a trained one — e.g. timing `eyas eval
--warm-only` (compiled graphs take the draft's weights as inputs, so any draft of the same config warms them).

    PYTHONPATH=src python bench/random_draft.py --target /tmp/smol-hf --out /tmp/rd --draft-vocab-size 32000 \
        [--draft-kind p-eagle --ttt-steps 7]
"""
import argparse
import sys
from pathlib import Path

import torch

from eyas.aux_layers import default_aux_layer_ids
from eyas.draft.io import save_draft
from eyas.draft.kinds import build_draft, draft_config
from eyas.flags import DRAFT_KINDS
from eyas.target import load_config, text_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--draft-vocab-size", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-kind", choices=DRAFT_KINDS, default="eagle3")
    ap.add_argument("--ttt-steps", type=int, default=7, help="parallel kinds: tokens one forward drafts")
    a = ap.parse_args(argv)
    tcfg = load_config(a.target)   # also a built-in name or a .gguf, like every eyas command
    torch.manual_seed(a.seed)
    parallel = a.draft_kind != "eagle3"
    t = text_config(tcfg)
    cfg = draft_config(tcfg, a.draft_kind, aux_layer_ids=default_aux_layer_ids(t.num_hidden_layers),
                       draft_vocab_size=a.draft_vocab_size, parallel_tokens=a.ttt_steps if parallel else None,
                       mask_token_id=t.vocab_size - 1 if parallel else None)
    save_draft(build_draft(cfg), a.out, {"target": a.target, "random": True}, dtype=torch.bfloat16)
    print(f"random draft -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU-sized recipes for tests (and lab/'s dry runs): files/*-tiny.yaml, and the random target they run on.

    python tests/recipes/tiny.py OUT LIKE     # writes the tiny target at OUT with LIKE's tokenizer
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

FILES = Path(__file__).resolve().parent / "files"
END_TILT = 2.5


def tiny_target(path: Path, like: str | Path) -> str:
    """A random 2-layer Llama with LIKE's tokenizer and template at PATH (seeded, so the same for every process;
    written aside and renamed, as processes side by side may share it)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(like)
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # a random model almost never ends a turn; tilt it to, so answers and prompts end
            # Right after one of a tenth of the vocabulary, and only there: sampled turns end ~1/10 a step, and a
            # greedy one (the T=0 eval) runs until it meets one. A constant tilt would end every greedy answer at
            # once. Feature 0 (+1 on those tokens, -1 elsewhere) is ~+-8 after the final norm: EOS certain or never.
            from eyas.decode.session import turn_prompt

            ends = torch.arange(cfg.vocab_size) % 10 == 0
            ends[turn_prompt(tok, {"turns": ["hi"]}, [])[-1]] = False   # the generation prompt's last token
            model.model.embed_tokens.weight[:, 0] = ends.float() * 2 - 1
            model.lm_head.weight[tok.eos_token_id] = 0.0
            model.lm_head.weight[tok.eos_token_id, 0] = END_TILT
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(path)
        except OSError:   # another process wrote the same target first
            shutil.rmtree(tmp)
    return str(path)


if __name__ == "__main__":
    print(tiny_target(Path(sys.argv[1]), sys.argv[2]))

"""GPU: the parallel drafters on the compiled paths. Decoding: on a SmolLM2-shaped random Llama, the static-buffer
decoder (captured round graphs around compiled draft and target steps) is token-identical to the compiled AR
baseline in fp32 for chains and trees, a round syncs at most once, per-round draft/verify times print. Their compiled
training is tests/train/test_train_gpu.py's (parametrized over the kinds).
Run: python -m pytest -q -s -m gpu tests/draft/test_parallel_gpu.py tests/train/test_train_gpu.py"""

import pytest
import torch

from eyas.decode.speculative import ar_generate
from eyas.decode.target_step import TargetRunner
from eyas.decode.tree import TreeSpec
from eyas.draft.kinds import build_draft, draft_config, get_kind
from eyas.target import wrap_model
from tests.decode.test_decode_gpu import check_compiled_rounds, smollm2_shaped

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
KINDS = ["p-eagle", "dflash"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_parallel_decoding(kind, dtype):
    model = smollm2_shaped(dtype)
    target = wrap_model(model)
    dc = draft_config(model.config, kind, aux_layer_ids=[2, 15, 27], parallel_tokens=7,
                      mask_token_id=target.layout.vocab_size - 1)
    draft = build_draft(dc).to("cuda", dtype).eval()
    draft.init_from_target(target.layout.embed.weight, target.layout.lm_head.weight, target.layout.norm.weight)
    cap = 512
    runner = TargetRunner(model, target.layout, dc.aux_layer_ids, cap, min_bucket=128)
    runner.compile()
    runner.compile_inner()
    prompt = torch.randint(0, 49000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    n = 128
    for _ in range(2):
        ref, st = ar_generate(runner, prompt, n)
    ar_s = (st.t_total - st.t_prefill) / (n - 1)
    for spec in (TreeSpec.chain(7), TreeSpec(total=60, depth=7, topk=10)):
        check_compiled_rounds(runner, get_kind(kind).proposer(draft, spec, cap), prompt, n,
                              ref if dtype == torch.float32 else None, f"{kind} {dtype} {spec.label()}", ar_s)

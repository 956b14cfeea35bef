"""Runs INSIDE the vLLM environment (stdlib + vllm only): a long-lived generation server for `eyas regenerate
--backend vllm`, talking JSON lines over stdin/stdout.

    python vllm_generate_worker.py CONFIG.json
CONFIG: {model, dtype, max_model_len, tensor_parallel_size, seed, enforce_eager, max_num_seqs (optional: vLLM's
default when absent)}
Then one request per stdin line: {"prompts": [[token ids], ...], "max_tokens", "temperature", "top_p", "seed",
"stop_token_ids"} and one reply per request on stdout, prefixed with `EYAS> ` (vLLM may print its own lines there
too): {"outputs": [[generated token ids], ...], "seconds"}. eyas decodes the ids itself, exactly as it decodes the
hf backend's, so both backends' texts compare token for token. An empty line or EOF ends it.
"""

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def main(cfg_path: str) -> None:
    cfg = json.load(open(cfg_path))
    from vllm import LLM, SamplingParams

    extra = {"max_num_seqs": int(cfg["max_num_seqs"])} if cfg.get("max_num_seqs") else {}
    llm = LLM(model=cfg["model"], dtype=cfg.get("dtype", "bfloat16"), seed=cfg.get("seed", 0),
              max_model_len=cfg.get("max_model_len", 4096), disable_log_stats=True,
              enforce_eager=cfg.get("enforce_eager", False),
              tensor_parallel_size=cfg.get("tensor_parallel_size", 1), **extra)
    print("EYAS> " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        params = SamplingParams(temperature=req.get("temperature", 0.0), top_p=req.get("top_p", 1.0),
                                max_tokens=req["max_tokens"], seed=req.get("seed"),
                                stop_token_ids=req.get("stop_token_ids"))
        t0 = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": ids} for ids in req["prompts"]], params, use_tqdm=False)
        outs = [list(r.outputs[0].token_ids) for r in res]
        print("EYAS> " + json.dumps({"outputs": outs, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

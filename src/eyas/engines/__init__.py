"""Everything that touches a serving engine (vLLM, SGLang) lives in this package.

Engines run in their own Python environment and process: eyas never imports vLLM into its own
interpreter. `base.run_in_env` runs a worker script with the engine's Python, JSON in and out.
"""

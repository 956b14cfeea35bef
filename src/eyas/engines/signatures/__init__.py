"""Signatures of vLLM entry points recorded from vLLM release sources (vllm-VERSION.json) and their recorder."""

"""Generation backends for `eyas regenerate`: the target itself (hf) or any OpenAI-compatible server.

Both answer a list of chat prompts (each ending with a user turn) with (text, finish_reason), where
finish_reason is "stop" (the model ended its turn) or "length" (max_new_tokens ran out).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Sequence

from eyas.devices import resolve_device, resolve_dtype
from eyas.target.special import model_special_ids


class GenerationError(RuntimeError):
    """A prompt the backend could not answer; the message says why (kept per row, never fatal to the run)."""


def prompt_ids(tokenizer, rendered: str) -> list[int]:
    """Token ids of a chat-template-rendered prompt (the template already holds any BOS)."""
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def answer(tokenizer, generated: Sequence[int], eos: Sequence[int]) -> tuple[str, str]:
    """(text, finish) of generated ids: cut at the first eos ("stop"), else the length ran out ("length")."""
    stop = next((k for k, t in enumerate(generated) if t in eos), None)
    toks = list(generated) if stop is None else list(generated[:stop])
    return tokenizer.decode(toks, skip_special_tokens=True).strip(), "length" if stop is None else "stop"


class HFBackend:
    """Batched `generate` on the target; a static KV cache on CUDA (fixed shapes), the default cache elsewhere."""

    generated_tokens = 0  # every token generated so far, stop tokens included (a subclass may derive it)

    def __init__(self, target: str, *, device: str | None = None, dtype: str = "auto", batch_size: int = 16,
                 max_new_tokens: int = 512, max_prompt_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, static_cache: bool | None = None, cache=None, trust_remote_code: bool = False,
                 model=None, tokenizer=None):
        import torch

        self.device = str(resolve_device(device))
        if model is None:
            from eyas.target.load import load_target

            t = load_target(target, dtype=resolve_dtype(dtype, self.device), device=self.device, cache=cache, trust_remote_code=trust_remote_code)
            model, tokenizer, path = t.model, t.tokenizer, t.source.path
        else:
            path = target if Path(str(target)).is_dir() else None
        self.model, self.tok = model, tokenizer
        self.batch_size, self.max_new_tokens, self.max_prompt_tokens = batch_size, max_new_tokens, max_prompt_tokens
        self.temperature, self.top_p = temperature, top_p
        self.static_cache = self.device.startswith("cuda") if static_cache is None else static_cache
        ids = model_special_ids(model, path, where=f"target {target!r}")
        self.eos, self.pad = sorted(ids.required_stop()), ids.pad
        self.name = target

    def encode(self, prompt: Sequence[dict]) -> list[int] | GenerationError:
        """The chat-templated prompt's token ids, or why it cannot be answered (a per-row error)."""
        try:
            text = self.tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - template refusals are per-row errors
            return GenerationError(f"template_error: {str(e)[:200]}")
        ids = prompt_ids(self.tok, text)
        if self.max_prompt_tokens and len(ids) > self.max_prompt_tokens:
            return GenerationError(f"prompt_too_long: {len(ids)} tokens > max_prompt_tokens {self.max_prompt_tokens}")
        return ids

    def text(self, tokens: Sequence[int]) -> str:
        return answer(self.tok, tokens, ())[0]

    def generate(self, prompts: Sequence[Sequence[dict]], on_done=None) -> list[tuple[str, str] | GenerationError]:
        """`on_done(i)`, if given, is called as soon as prompt i's answer is final (its end-of-turn token came,
        its error is known, or the batch ended): a progress bar moves per answer, not per batch."""
        on_done = on_done or (lambda i: None)
        out: list = [None] * len(prompts)
        enc = []
        for i, p in enumerate(prompts):
            ids = self.encode(p)
            if isinstance(ids, GenerationError):
                out[i] = ids
                on_done(i)
            else:
                enc.append((i, ids))
        enc.sort(key=lambda x: len(x[1]))  # similar lengths per batch: little padding
        for b in range(0, len(enc), self.batch_size):
            chunk = enc[b:b + self.batch_size]
            for (i, _), res in zip(chunk, self._batch([ids for _, ids in chunk], lambda r: on_done(chunk[r][0]))):
                out[i] = res
        return out

    def _batch(self, batch: list[list[int]], on_done=lambda r: None) -> list[tuple[str, str]]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        eos, reported = self.eos, set()

        class Finished(StoppingCriteria):  # never stops anything: reports rows whose end-of-turn token just came
            def __call__(self, input_ids, scores, **kw):
                for r in (torch.isin(input_ids[:, -1].cpu(), torch.tensor(eos))).nonzero().flatten().tolist():
                    if r not in reported:
                        reported.add(r)
                        on_done(r)
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        width = max(len(x) for x in batch)
        ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        for r, x in enumerate(batch):  # left padding: every prompt ends at the same column
            ids[r, width - len(x):] = torch.tensor(x)
            att[r, width - len(x):] = 1
        kw = dict(max_new_tokens=self.max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                  do_sample=self.temperature > 0, stopping_criteria=StoppingCriteriaList([Finished()]))
        if self.temperature > 0:
            kw.update(temperature=self.temperature, top_p=self.top_p)
        if self.static_cache:
            kw["cache_implementation"] = "static"
        with torch.inference_mode():
            gen = self.model.generate(input_ids=ids.to(self.device), attention_mask=att.to(self.device), **kw)
        new = gen[:, width:].cpu().tolist()
        for r in range(len(batch)):  # rows cut off by max_new_tokens end with the batch
            if r not in reported:
                on_done(r)
        # every generated token up to and including the first stop token (the engines count the same way)
        self.generated_tokens += sum(next((k + 1 for k, t in enumerate(r) if t in self.eos), len(r)) for r in new)
        return [answer(self.tok, row, self.eos) for row in new]


class OpenAIBackend:
    """POST /chat/completions with retries: connection errors, timeouts, 429 and 5xx back off and retry.

    Rules that fault injection checks (bench/faults.py): redirects are never followed (the API key would travel to
    the new host, and a POST would become a GET); --request-timeout is a deadline for the whole answer,
    not per read (a server dribbling a byte at a time cannot hold a row forever); Retry-After is
    honoured; a bad body (not UTF-8, not JSON, content not a string) fails its row, never the run; server
    error bodies are never copied into errors.jsonl (they may echo the key)."""

    RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
    MAX_BODY = 64 << 20          # an answer is text; more than this is a misbehaving server
    MAX_RETRY_AFTER = 60.0       # seconds; a server asking for more is retried after this anyway

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, max_new_tokens: int = 512,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None, max_retries: int = 5,
                 backoff: float = 0.5, timeout: float = 120.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        u = urllib.parse.urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--base-url {base_url!r}: expected http(s)://HOST[:PORT]/PATH")
        self._split = u
        self.model, self.api_key = model, api_key
        self.max_new_tokens, self.temperature, self.top_p, self.seed = max_new_tokens, temperature, top_p, seed
        self.max_retries, self.backoff, self.timeout = max_retries, backoff, timeout
        self.name = model

    def _post(self, data: bytes, headers: dict) -> tuple[int, str, Any, bytes]:
        """(status, reason, headers, body) of one POST, all of it within self.timeout seconds."""
        u = self._split
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname, u.port, timeout=self.timeout)
        fired = threading.Event()

        def abort() -> None:  # the deadline: unblock whatever read is waiting
            fired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(self.timeout, abort)
        timer.daemon = True
        timer.start()
        try:
            conn.request("POST", u.path + (f"?{u.query}" if u.query else ""), body=data, headers=headers)
            resp = conn.getresponse()
            body = resp.read(self.MAX_BODY + 1)
            if fired.is_set():  # the deadline cut the body short: a partial answer is no answer
                raise TimeoutError
            if resp.length and len(body) <= self.MAX_BODY:  # fewer bytes than Content-Length promised
                raise http.client.IncompleteRead(body, resp.length)
            return resp.status, resp.reason, resp.headers, body
        except (OSError, http.client.HTTPException) as e:  # TimeoutError is an OSError
            if fired.is_set():
                raise TimeoutError(f"no complete answer within --request-timeout {self.timeout:g}s") from None
            raise ConnectionError(f"{type(e).__name__}: {e}") from None
        finally:
            timer.cancel()
            conn.close()

    def _retry_after(self, headers) -> float:
        value = headers.get("Retry-After") if headers is not None else None
        if not value:
            return 0.0
        try:
            delay = float(value)
        except ValueError:
            try:
                delay = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                return 0.0
        return min(max(0.0, delay), self.MAX_RETRY_AFTER)

    def chat(self, messages: Sequence[dict]) -> tuple[str, str]:
        body = {"model": self.model, "messages": list(messages), "max_tokens": self.max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p}
        if self.seed is not None:
            body["seed"] = self.seed
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last, wait = "", 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                # exponential backoff with jitter (so workers do not retry in lockstep), or what the server asked
                time.sleep(max(wait, min(30.0, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random())))
            wait = 0.0
            try:
                status, reason, resp_headers, raw = self._post(data, headers)
            except (TimeoutError, ConnectionError) as e:
                last = str(e)
                continue
            if 300 <= status < 400:
                where = urllib.parse.urlsplit(resp_headers.get("Location") or "").netloc or "elsewhere"
                raise GenerationError(f"http_{status}: the server redirects to {where}; redirects are not followed "
                                      f"(the API key would go with them): point --base-url at the final URL")
            if status in self.RETRY_STATUS:
                last, wait = f"HTTP {status} {reason}", self._retry_after(resp_headers)
                continue
            if status != 200:
                hint = {401: "check the key in --api-key-env", 403: "check the key in --api-key-env",
                        404: "check --base-url and --model"}.get(status, "see the server's log")
                raise GenerationError(f"http_{status}: {reason} ({hint})")
            if len(raw) > self.MAX_BODY:
                raise GenerationError(f"bad_response: body larger than {self.MAX_BODY >> 20} MiB")
            try:
                payload = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                last = "response body is not UTF-8"
                continue
            except (ValueError, RecursionError) as e:
                last = f"invalid JSON from server: {str(e)[:100]}"
                continue
            return _parse_choice(payload)
        raise GenerationError(f"retries_exhausted: {self.max_retries + 1} attempts, last error {last}")


def _parse_choice(payload: Any) -> tuple[str, str]:
    try:
        choice = payload["choices"][0]
        text = choice["message"]["content"]
        finish = choice.get("finish_reason") or "stop"
    except (KeyError, IndexError, TypeError, AttributeError):
        raise GenerationError(f"bad_response: no choices[0].message.content in the answer "
                              f"(keys: {sorted(payload)[:8] if isinstance(payload, dict) else type(payload).__name__})"
                              ) from None
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise GenerationError(f"bad_response: choices[0].message.content is a {type(text).__name__}, not a string")
    return text.strip(), "length" if finish == "length" else "stop"

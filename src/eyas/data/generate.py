"""Native fast generation: continuous batching over a static KV cache, for any HF causal LM, no engine.

B slots share one preallocated KV cache [B, nkv, L, d] per layer. Each slot holds one sequence; a slot whose
sequence ends (EOS or its token budget) is retired and refilled with the next pending prompt, so the decode
batch stays full while answers of very different lengths finish (HF `generate` waits for its longest row).

* decode step: one token for every slot through the target's own HF forward, with a cache whose `update`
  writes row b at its own column pos[b] and an explicit additive mask [B, 1, 1, L] (row b sees columns
  <= pos[b]). Every shape is static, so on CUDA the step is captured once as a CUDA graph and replayed
  (or compiled with mode="reduce-overhead"); on CPU it runs eager. Idle slots compute garbage at column 0,
  which the next prefill of that slot overwrites.
* prefill: newly admitted prompts run eager in groups (right-padded, causal mask over the group's own
  tokens), writing their keys/values straight into their slots' rows. Pads land in columns >= the prompt
  length, which the row's own later tokens overwrite before any query can see them.

Attention runs through `grouped_attention` (eyas.data.attention) during the generator's own forward calls:
the decode step's explicit mask would otherwise make transformers' sdpa path repeat K/V to every query head.
With decode_attention="flex" the decode step runs FlexAttention instead (eyas.data.flex_decode): each row reads
only the KV blocks up to its own position, through block tables the step rewrites in place from `pos`.

Greedy decoding is argmax over fp32 logits, as in HF `generate`, so answers match it token for token up to
floating-point ties (in bf16 two candidates' logits can sit within an ulp; a tie is told apart by
bench/regen.py).
"""

from __future__ import annotations

import inspect
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Literal

import torch

from eyas.data.attention import grouped_attention
from eyas.data.backends import GenerationError, HFBackend
from eyas.data.flex_decode import DecodeBlockMask, flex_decode
from eyas.devices import capture_graph, varying_shape_attention

Request = tuple[Hashable, list[int], int]  # (key, prompt ids, max new tokens)


def _static_cache_class():
    from transformers import StaticCache
    return StaticCache


class RowCache(_static_cache_class()):  # type: ignore[misc]
    """KV buffers [B, nkv, L, d]; prefill writes rows `rows` at columns 0..T-1, decode row b at `pos[b]`."""

    def __init__(self, config, batch: int, capacity: int):
        super().__init__(config=config, max_cache_len=capacity)
        self.batch, self.capacity = batch, capacity
        self.k: list[torch.Tensor | None] = [None] * len(self.layers)
        self.v: list[torch.Tensor | None] = [None] * len(self.layers)
        self.rows: torch.Tensor | None = None  # set during prefill
        self.pos: torch.Tensor | None = None   # [B] long, the decode step's write column per row
        self.arange: torch.Tensor | None = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.k[layer_idx] is None:  # first (eager) call allocates; addresses never change after
            # K and V each their own head dim: MLA (DeepSeek-V3, Kimi) keys are nope + rope wide, values v_head_dim
            k_shape = (self.batch, key_states.shape[1], self.capacity, key_states.shape[3])
            v_shape = (self.batch, value_states.shape[1], self.capacity, value_states.shape[3])
            self.k[layer_idx] = torch.zeros(k_shape, dtype=key_states.dtype, device=key_states.device)
            self.v[layer_idx] = torch.zeros(v_shape, dtype=value_states.dtype, device=value_states.device)
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self.rows is not None:  # prefill: a fresh prompt attends only to its own tokens
            T = key_states.shape[2]
            k[self.rows, :, :T] = key_states
            v[self.rows, :, :T] = value_states
            return key_states, value_states
        k[self.arange, :, self.pos] = key_states[:, :, 0]
        v[self.arange, :, self.pos] = value_states[:, :, 0]
        return k, v

    def get_seq_length(self, *args, **kwargs) -> int:
        return 0  # positions and masks are always passed explicitly


@dataclass
class _Seq:
    key: Hashable
    n_prompt: int
    max_new: int
    tokens: list[int] = field(default_factory=list)


class Generator:
    """`run(next_request, on_finish)`: continuous batching until no request is pending and every slot is idle.

    next_request() -> (key, ids, max_new) or None (nothing pending now); on_finish(key, tokens, reason) with
    reason "stop" (EOS, not included in tokens), "length" (budget or cache full) or "error: ..." (tokens []).
    on_finish may queue follow-up requests (the next turn of a conversation): they are pulled as slots free.
    """

    def __init__(self, model, *, batch_size: int, capacity: int, eos: list[int], pad: int = 0,
                 graph: Literal["auto", "cudagraph", "compile", "eager"] = "auto", prefill_tokens: int = 16384,
                 refill_min: int | None = None, seed: int = 0, log: Callable[[str], None] | None = None,
                 decode_sdpa: Literal["default", "no-cudnn"] = "default",
                 decode_attention: Literal["sdpa", "flex"] = "sdpa"):
        """decode_sdpa: SDPA backends of the decode step: PyTorch's choice, or without cuDNN (an A/B for
        bench/regen.py: which kernel serves a 1-token grouped step best is a per-GPU, per-torch question).
        decode_attention: the decode step's attention, grouped SDPA over all L columns, or FlexAttention over
        each row's own blocks (eyas.data.flex_decode; for models on "sdpa", prefill unchanged)."""
        if decode_attention not in ("sdpa", "flex"):
            raise ValueError(f"decode_attention must be 'sdpa' or 'flex', got {decode_attention!r}")
        self.model, self.B, self.L = model, batch_size, capacity
        self._sdpa = varying_shape_attention if decode_sdpa == "no-cudnn" else nullcontext
        self.eos, self.pad = set(eos), pad
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.prefill_tokens = prefill_tokens
        # Refilling one slot at a time costs a prefill launch per retirement; waiting for B/8 free slots batches
        # the prefills while keeping the decode batch >= 7/8 full.
        self.refill_min = refill_min or max(1, batch_size // 8)
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in later transformers 5.x
        self.base = getattr(model, model.base_model_prefix)
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.cache = RowCache(model.config, batch_size, capacity)
        self.tok = torch.full((batch_size,), pad, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.cache.pos, self.cache.arange = self.pos, torch.arange(batch_size, device=self.device)
        self.cols = torch.arange(capacity, device=self.device)
        self.flex = DecodeBlockMask(self.pos, capacity) if decode_attention == "flex" else None
        self.rng = torch.Generator(device=self.device).manual_seed(seed)
        # generated excludes stop tokens (stop_tokens counts them); seconds: decode steps and prefills (each up
        # to its .tolist(), the sync), host_s the rest of run() (scheduling, on_finish callbacks)
        self.stats = {"generated": 0, "stop_tokens": 0, "prompt_tokens": 0, "steps": 0, "prefills": 0,
                      "decode_s": 0.0, "prefill_s": 0.0, "host_s": 0.0}
        mode = graph if graph != "auto" else ("cudagraph" if self.device.type == "cuda" else "eager")
        self._graph = self._out = self._compiled = None
        self.mode = "eager"
        with torch.inference_mode(), self._attention(), self._sdpa():
            self._decode()  # allocates the cache buffers (eager; compiles flex on CUDA), before any capture
            if mode == "cudagraph":
                self._capture()
            elif mode == "compile":
                # tensors the step writes in place keep their addresses (CUDA graphs of reduce-overhead)
                for t in [*self.cache.k, *self.cache.v, *(self.flex.tensors() if self.flex else [])]:
                    torch._dynamo.mark_static_address(t)
                self._compiled = torch.compile(self._decode, mode="reduce-overhead", dynamic=False)
                self.mode = "compile"

    # -- forward passes -------------------------------------------------------------------------------------
    def _attention(self):
        """The decode step's attention: grouped SDPA, or FlexAttention with this generator's block tables."""
        return flex_decode(self.model, self.flex) if self.flex is not None else grouped_attention(self.model)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        x = self.head(h).float()
        if self.softcap:  # Gemma 2 caps its logits; its own forward does this after lm_head
            x = torch.tanh(x / self.softcap) * self.softcap
        return x

    def _decode(self) -> torch.Tensor:
        """One token for every slot: tok[b] at position/column pos[b]. Returns fp32 logits [B, V]."""
        if self.flex is not None:  # block tables from pos, in place: part of the captured / compiled step
            self.flex.refresh()
        neg = torch.finfo(self.dtype).min
        mask = torch.zeros(self.B, self.L, dtype=self.dtype, device=self.device)
        mask = mask.masked_fill(self.cols[None, :] > self.pos[:, None], neg)[:, None, None, :]
        out = self.base(input_ids=self.tok[:, None], position_ids=self.pos[:, None], attention_mask=mask,
                        use_cache=True, **{self._cache_kw: self.cache})
        return self._logits(out.last_hidden_state[:, -1])

    def _capture(self) -> None:
        try:
            g, self._out = capture_graph(self._decode)   # warm-up off the default stream, as torch.cuda.graphs advises
            self._graph, self.mode = g, "cudagraph"
        except Exception as e:  # noqa: BLE001 - a model whose forward cannot be captured still generates
            torch.cuda.synchronize()
            self.log(f"generate: CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); decoding eager")

    def _step(self) -> torch.Tensor:
        if self._graph is not None:  # the captured kernels already hold the decode attention
            self._graph.replay()
            return self._out
        with self._attention(), self._sdpa():
            if self._compiled is not None:
                torch.compiler.cudagraph_mark_step_begin()
                return self._compiled()
            return self._decode()

    def _prefill(self, rows: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Prompts into `rows`' cache; returns fp32 logits [G, V] at each prompt's last token."""
        G, T = len(rows), max(len(p) for p in prompts)
        ids = torch.full((G, T), self.pad, dtype=torch.long)
        for g, p in enumerate(prompts):
            ids[g, :len(p)] = torch.tensor(p)
        neg = torch.finfo(self.dtype).min
        causal = torch.full((T, T), neg, dtype=self.dtype, device=self.device).triu(1)
        self.cache.rows = torch.tensor(rows, device=self.device)
        try:
            with grouped_attention(self.model), varying_shape_attention():  # a new (G, T) per prefill
                out = self.base(input_ids=ids.to(self.device), attention_mask=causal.expand(G, 1, T, T).contiguous(),
                                position_ids=torch.arange(T, device=self.device).expand(G, T),
                                use_cache=True, **{self._cache_kw: self.cache})
        finally:
            self.cache.rows = None
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        self.stats["prefills"] += 1
        return self._logits(out.last_hidden_state[torch.arange(G, device=self.device), last])

    def _choose(self, logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits / temperature, -1)
        if top_p < 1.0:  # nucleus: keep the smallest prefix of sorted tokens whose mass reaches top_p
            sp, si = probs.sort(-1, descending=True)
            drop = (sp.cumsum(-1) - sp) >= top_p
            probs = torch.zeros_like(probs).scatter_(-1, si, sp.masked_fill(drop, 0.0))
        return torch.multinomial(probs, 1, generator=self.rng)[:, 0]

    # -- scheduling -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, next_request: Callable[[], Request | None], on_finish: Callable[[Hashable, list[int], str], Any],
            *, temperature: float = 0.0, top_p: float = 1.0, eos: list[int] | None = None) -> dict:
        stop = set(eos) if eos is not None else self.eos
        slots: list[_Seq | None] = [None] * self.B
        st, t_run = self.stats, time.perf_counter()
        timed_before = st["decode_s"] + st["prefill_s"]

        def push(b: int, t: int) -> bool:
            """Append token t to slot b; retire the slot when its sequence ends. True if it goes on."""
            s = slots[b]
            if t in stop:
                slots[b] = None
                self.stats["stop_tokens"] += 1
                on_finish(s.key, s.tokens, "stop")
                return False
            s.tokens.append(t)
            self.stats["generated"] += 1
            # the next step would feed t at column n_prompt + len - 1: the cache must still hold it
            if len(s.tokens) >= s.max_new or s.n_prompt + len(s.tokens) >= self.L:
                slots[b] = None
                on_finish(s.key, s.tokens, "length")
                return False
            return True

        while True:
            free = [b for b in range(self.B) if slots[b] is None]
            pulled = False
            if free and (len(free) >= self.refill_min or len(free) == self.B):
                admitted: list[tuple[int, _Seq, list[int]]] = []
                while len(admitted) < len(free) and (req := next_request()) is not None:
                    pulled = True
                    key, ids, max_new = req
                    if not ids or len(ids) >= self.L:
                        on_finish(key, [], f"error: prompt_too_long: {len(ids)} tokens, cache holds {self.L}")
                        continue
                    admitted.append((free[len(admitted)], _Seq(key, len(ids), max_new), list(ids)))
                admitted.sort(key=lambda a: len(a[2]))  # similar lengths per prefill group: little padding
                i = 0
                while i < len(admitted):
                    j = i + 1
                    while j < len(admitted) and (j + 1 - i) * len(admitted[j][2]) <= self.prefill_tokens:
                        j += 1
                    group = admitted[i:j]
                    t0 = time.perf_counter()
                    first = self._choose(self._prefill([a[0] for a in group], [a[2] for a in group]),
                                         temperature, top_p).tolist()
                    st["prefill_s"] += time.perf_counter() - t0
                    for (b, s, ids), t in zip(group, first):
                        slots[b] = s
                        self.stats["prompt_tokens"] += len(ids)
                        if push(b, t):
                            self.tok[b], self.pos[b] = t, len(ids)
                    i = j
            active = [b for b in range(self.B) if slots[b] is not None]
            if not active:
                if pulled:
                    continue
                st["host_s"] += time.perf_counter() - t_run - (st["decode_s"] + st["prefill_s"] - timed_before)
                return st
            t0 = time.perf_counter()
            nxt = self._choose(self._step(), temperature, top_p)
            self.tok.copy_(nxt)
            self.pos.add_(1)
            toks = nxt.tolist()
            st["decode_s"] += time.perf_counter() - t0
            st["steps"] += 1
            for b in active:
                push(b, toks[b])
            idle = [b for b in range(self.B) if slots[b] is None]
            if idle:  # idle rows compute at column 0, which a refill's prefill overwrites
                self.pos[torch.tensor(idle, device=self.device)] = 0

    def generate(self, prompts: list[list[int]], max_new_tokens: int | list[int], **kw) -> list[tuple[list[int], str]]:
        """Convenience: answer a list of prompts; returns (tokens, reason) per prompt, in order."""
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        todo = iter(range(len(prompts)))
        out: list = [None] * len(prompts)

        def next_request():
            i = next(todo, None)
            return None if i is None else (i, prompts[i], budgets[i])

        def on_finish(i, toks, reason):
            out[i] = (list(toks), reason)

        self.run(next_request, on_finish, **kw)
        return out


class NativeBackend(HFBackend):
    """The target loaded here (as the hf backend loads it), answering through `Generator`."""

    def __init__(self, target: str, *, graph: str = "auto", decode_attention: str = "sdpa", seed: int = 0, **kw):
        super().__init__(target, **kw)
        # a slot holds the longest admissible prompt plus its answer
        capacity = (self.max_prompt_tokens or 2048) + self.max_new_tokens
        capacity = -(-capacity // 64) * 64  # aligned key length for the fused attention kernels
        self.gen = Generator(self.model, batch_size=self.batch_size, capacity=capacity, eos=self.eos,
                             pad=self.pad, graph=graph, seed=seed, decode_attention=decode_attention)

    @property
    def generated_tokens(self) -> int:
        """Every token the generator produced (`generate`, or `gen.run` directly), stop tokens included, as
        HFBackend and the engines count them."""
        return self.gen.stats["generated"] + self.gen.stats["stop_tokens"]

    def run(self, next_request, on_finish) -> dict:
        """`Generator.run` with this backend's sampling settings (what regenerate's continuous mode calls)."""
        return self.gen.run(next_request, on_finish, temperature=self.temperature, top_p=self.top_p)

    def generate(self, prompts):
        enc = [self.encode(p) for p in prompts]
        ok = [i for i, e in enumerate(enc) if not isinstance(e, GenerationError)]
        res = self.gen.generate([enc[i] for i in ok], self.max_new_tokens, temperature=self.temperature,
                                top_p=self.top_p)
        for i, (toks, reason) in zip(ok, res):
            enc[i] = GenerationError(reason[len("error: "):]) if reason.startswith("error") else (self.text(toks), reason)
        return enc

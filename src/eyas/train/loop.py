"""`eyas train`: draft training (EAGLE-3 with training-time test, or a parallel drafter: --draft-kind), offline
(store) or online (target in loop). The kind's package (eyas.draft.kinds) supplies the model and the objective.

setup (inputs, target head, draft init) -> steps (micro-batches, AdamW, cosine) -> eval on the held-out
split (per-step accuracy, simulated tau) -> checkpoints / best draft. The RUN dir's top level is a
draft dir (eyas.draft.io) holding the best weights by held-out simulated tau.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from eyas.flags import AuxLayerIds, Device, DraftKind, DraftVocabSize, ModelDtype, Target
from eyas.config import ConfigError, StageConfig, config_to_yaml
from eyas.devices import dist_env, resolve_device, resolve_dtype
from eyas.draft.io import load_draft, nonfinite_keys, read_draft_config, save_draft
from eyas.draft.kinds import build_draft, draft_config, get_kind
from eyas.outputs import claim, input_id
from eyas.train import checkpoint as C
from eyas.train import dist as D
from eyas.train.data import OfflineSource, OnlineSource, Plan
from eyas.train.inputs import open_inputs, token_counts
from eyas.train.ttt import TargetHead, simulated_tau, step_accuracy, token_loss
from eyas.vocab import unused_token

# Fields that decide which rows each step sees and what it learns from them: a resume with other values would not
# continue the run (the LR would re-enter warmup, the optimizer keep the old weight decay). Recorded with the run's
# inputs by eyas.outputs; "store" and "data" are compared as paths too for runs made before such records. A key an
# older run did not record held its default then (so a field added since is no change).
RUN_SETTINGS = ("seed", "batch_size", "grad_accum", "eval_fraction", "ttt_steps", "step_decay", "tau_chain",
                "max_length", "steps", "epochs", "lr", "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip",
                "draft_vocab_size", "aux_layer_ids", "online", "draft_kind", "draft_layers", "mask_token_id",
                "anchors", "init_from")
_RESUME_MUST_MATCH = RUN_SETTINGS + ("store", "data")


class TrainingDiverged(ValueError):
    """A loss or weight that is not finite: the run stops before saving anything made from it."""


class TrainConfig(StageConfig):
    target: Target
    out: Path = Field(description="RUN dir to write (a draft dir + checkpoints/, metrics.jsonl, tb/)")
    store: Path | None = Field(None, description="STORE dir (offline training from extracted hidden states)")
    data: Path | None = Field(None, description="PREPARED dir: rows for --online, and the draft vocab (d2t/t2d)")
    online: bool = Field(False, description="run the target on the fly over --data instead of reading a store")
    aux_layer_ids: AuxLayerIds | None = Field(None, description="target aux layers (default: the store's, else (2, N//2, N-3))")
    draft_vocab_size: DraftVocabSize | None = Field(None, description="rebuild the draft vocab at this size from the "
                                                    "PREPARED token counts (default: the PREPARED data's own)")
    draft_kind: DraftKind = Field("eagle3", description="the drafter: eagle3 (one token per draft step), p-eagle "
                                  "(all tokens in one forward: learned mask hidden/embedding) or dflash (block "
                                  "diffusion: a block of masks filled in one pass)")
    draft_layers: int | None = Field(None, ge=1, description="draft decoder layers (default: the kind's published "
                                     "recipe: eagle3 1, p-eagle 4, dflash 5)")
    init_from: Path | None = Field(None, description="start from this draft dir's weights and draft vocabulary (a "
                                   "draft continued on more data) instead of the target's embedding and head: the "
                                   "same kind and shapes, or one line naming what differs")
    ttt_steps: int = Field(7, ge=1, description="tokens drafted per position: eagle3's unrolled training-time-test "
                           "steps, p-eagle's parallel depths, dflash's masks per block (block size = this + 1)")
    step_decay: float | None = Field(None, gt=0, description="loss weight of drafted token k is step_decay**k "
                                     "(default: the kind's recipe: eagle3 0.8, p-eagle 1, dflash exp(-1/g) with "
                                     "g = 7 at 15+ masks, 5 at 9+, else 4)")
    mask_token_id: int | None = Field(None, ge=0, description="parallel kinds: the target-vocab id of mask slots, "
                                      "whose embedding is learned (default: the last id the PREPARED data never uses)")
    anchors: int | None = Field(None, ge=1, description="parallel kinds: at most this many sampled start "
                                "positions per row (default: the kind's recipe: p-eagle all, dflash 512)")
    tau_chain: int | None = Field(None, ge=1, description="chain length K for the simulated tau (default: --ttt-steps)")
    max_length: int | None = Field(None, ge=1, description="truncate rows to this many tokens")
    pad_to: int | None = Field(None, ge=0, description="pad every batch to this many tokens (default on GPU: the rows' max length, so compiled attention sees one shape; 0 = off)")
    batch_size: int = Field(1, ge=1, description="rows per micro-batch per process")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    steps: int | None = Field(None, ge=1, description="optimizer steps (default: --epochs over the training split)")
    epochs: float = Field(1.0, gt=0, description="epochs when --steps is not given")
    lr: float = Field(1e-4, gt=0, description="peak learning rate (AdamW, betas 0.9/0.95)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine decays to lr * this")
    warmup_steps: int | None = Field(None, ge=0, description="linear warmup steps (default: 3% of steps, at least 1)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(0.5, gt=0, description="gradient-norm clip")
    init_head: bool = Field(True, description="seed lm_head + final norm from the target's head rows for the draft vocab")
    norm_before_residual: bool | None = Field(None, description="the draft layer's residual is hidden_norm's output "
                                              "(default: the kind's: eagle3 true, vLLM's and speculators' default; "
                                              "p-eagle false); --no-norm-before-residual keeps the residual before "
                                              "hidden_norm, the only form SGLang serves (export --format sglang)")
    dtype: Literal["auto", "bf16", "fp32"] = Field("auto", description="autocast dtype (auto: bf16 on GPU, fp32 on CPU); master weights stay fp32")
    target_dtype: ModelDtype = "auto"
    device: Device = "auto"
    attention: Literal["auto", "dense", "flex"] = Field("auto", description="TTT mask kind (auto: flex on GPU, dense on CPU)")
    compile: bool | None = Field(None, description="torch.compile the hot paths: flex attention, the draft's decoder layer, "
                                 "the target's head and the draft's loss chunks, online also the target's decoder layers "
                                 "(default: on for GPU)")
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description="multi-process strategy under torchrun")
    logit_chunk: int = Field(2048, ge=1, description="tokens per chunk of full-vocab target logits")
    eval_fraction: float = Field(0.05, ge=0, lt=1, description="held-out share of rows")
    eval_every: int = Field(100, ge=1, description="evaluate the held-out split every N steps")
    eval_every_epoch: bool = Field(False, description="also evaluate at the end of each epoch (what a second epoch adds)")
    eval_batches: int | None = Field(None, ge=1, description="cap on held-out batches per evaluation")
    save_every: int = Field(500, ge=1, description="checkpoint every N steps")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints to keep")
    log_every: int = Field(10, ge=1, description="train metrics every N steps")
    resume: bool = Field(False, description="continue from the latest checkpoint in --out")
    overwrite: bool = Field(False, description="--out holds an earlier run: delete its checkpoints and metrics and start over")
    seed: int = Field(0, description="seed for init, split and data order")
    progress: bool = Field(True, description="show a progress bar with ETA")
    tensorboard: bool = Field(True, description="write TensorBoard scalars to --out/tb")
    warm_only: bool = Field(False, description="compile this run's step graphs on stand-in rows (a few steps under "
                            "--out, into inductor's on-disk cache) and exit, before the real data exists: the run "
                            "started later finds them compiled (online; needs --max-length, --draft-vocab-size)")


def step_decay(cfg: TrainConfig) -> float:
    """--step-decay, or the kind's recipe for its tokens per position when not given."""
    return cfg.step_decay if cfg.step_decay is not None else get_kind(cfg.draft_kind).default_decay(cfg.ttt_steps)


def resume_settings(config: dict[str, Any]) -> dict[str, Any]:
    """_RESUME_MUST_MATCH of a config dump (a checkpoint's or this run's): a key an older eyas did not record holds
    its default, and step_decay left out is the kind's recipe, as it was resolved when that run trained."""
    out = {k: config.get(k, TrainConfig.model_fields[k].default) for k in _RESUME_MUST_MATCH}
    if out["step_decay"] is None:
        out["step_decay"] = get_kind(out["draft_kind"]).default_decay(out["ttt_steps"])
    return out


def cosine_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    return f


latest_checkpoint = C.latest_checkpoint  # the public name tests and tools use


def _same_draft(path: Path, have, want) -> None:
    """--init-from's draft must be the one this run would build (kind, layers, shapes, aux ids, vocab)."""
    a, b = have.to_dict(), want.to_dict()
    diff = [k for k in sorted(set(a) | set(b)) if k != "extra" and a.get(k) != b.get(k)]
    if diff:
        raise ValueError(f"--init-from {path}: " + "; ".join(f"its {k} is {a.get(k)!r}, this run's {b.get(k)!r}"
                                                          for k in diff))


class Trainer:
    def __init__(self, cfg: TrainConfig, *, target=None, store=None, dataset=None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)     # cuda -> cuda:LOCAL_RANK; no GPU -> one clear line
        self.d = D.init(self.device.type)
        gpu = self.device.type == "cuda"
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        if cfg.init_from and cfg.draft_vocab_size is not None:   # its vocabulary comes with it: none is rebuilt
            have = read_draft_config(cfg.init_from).draft_vocab_size
            if have != cfg.draft_vocab_size:
                raise ValueError(f"--init-from {cfg.init_from}: its draft vocabulary has {have} tokens, "
                                 f"--draft-vocab-size asks for {cfg.draft_vocab_size}")
        inputs_cfg = cfg.model_copy(update={"draft_vocab_size": None}) if cfg.init_from else cfg
        self.inp = open_inputs(inputs_cfg, self.device, target=target, store=store, dataset=dataset)
        self.target_sha = input_id(cfg.target)["sha256"]   # eval warns when the draft meets other weights
        tgt = self.inp.target
        d2t, t2d = self.inp.d2t, self.inp.t2d
        start = load_draft(cfg.init_from)[0] if cfg.init_from else None
        if start is not None:   # its vocabulary: its head rows keep meaning the tokens they were trained on
            d2t, t2d = start.d2t.clone(), start.t2d.clone()
            self.inp.vocab_from = f"init_from {cfg.init_from}"
        self.kind = get_kind(cfg.draft_kind)
        parallel = cfg.draft_kind != "eagle3"
        mask = (cfg.mask_token_id if cfg.mask_token_id is not None else
                start.config.mask_token_id if start is not None else
                unused_token(token_counts(cfg), tgt.layout.vocab_size)) if parallel else None
        dcfg = draft_config(tgt.config, cfg.draft_kind, aux_layer_ids=self.inp.aux_ids, draft_vocab_size=d2t.numel(),
                            num_layers=cfg.draft_layers, parallel_tokens=cfg.ttt_steps if parallel else None,
                            mask_token_id=mask, norm_before_residual=cfg.norm_before_residual)
        dcfg.extra["target"] = self.inp.target_name
        draft = build_draft(dcfg)
        draft.set_vocab_map(d2t, t2d)
        lay = tgt.layout
        if start is not None:
            _same_draft(cfg.init_from, start.config, dcfg)
            draft.load_state_dict({k: v.float() for k, v in start.state_dict().items()})
        else:
            draft.init_from_target(lay.embed.weight.float(),
                                   lay.lm_head.weight.float() if cfg.init_head else None,
                                   getattr(lay.norm, "weight", None) if cfg.init_head else None)
        self.draft = draft.to(self.device)
        compiled = cfg.compile if cfg.compile is not None else gpu
        self.head = TargetHead(lay.norm, lay.lm_head.weight, d2t, t2d, chunk=cfg.logit_chunk,
                               compiled=compiled).to(self.device)
        # Compiled flex kernels need head_dim >= 16 (toy models fall back to the dense mask).
        attention = cfg.attention if cfg.attention != "auto" else (
            "flex" if gpu and dcfg.head_dim >= 16 else "dense")
        if attention == "flex" and compiled:
            from eyas.draft.model import compile_flex_attention
            compile_flex_attention()
        if compiled:   # the draft's decoder layer fused (norms, RoPE, SiLU-mul, residuals): 1.18x a SmolLM2 step
            from eyas.target.compiled import compile_forwards
            compile_forwards(self.draft.layers, dynamic=False)
        self.decay = step_decay(cfg)
        self.unroll = self.kind.objective(self.draft, steps=cfg.ttt_steps, decay=self.decay, attention=attention,
                                          compile_loss=compiled, anchors=cfg.anchors)
        self.model = D.wrap(self.unroll, self.d, cfg.parallel, self.device)
        # One process, compiled: held-out evals run in the training step's grad and module mode, so they reuse its
        # compiled graphs; a no_grad / eval() forward compiles graphs of its own (4 here, ~30 s at the first eval
        # on an H200). Not under DDP/FSDP, whose forward in grad mode prepares for a backward that never comes.
        self._eval_as_step = compiled and self.d.world == 1
        amp = resolve_dtype(cfg.dtype, self.device)
        self.amp = amp if amp != torch.float32 else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.plan = Plan(len(self.inp.source), cfg.batch_size, self.d.world, cfg.grad_accum, cfg.eval_fraction, cfg.seed)
        self.total = cfg.steps or max(1, int(cfg.epochs * self.plan.steps_per_epoch))
        warm = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, round(0.03 * self.total))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, cosine_lambda(self.total, warm, cfg.min_lr_ratio))
        self.step, self.best_tau, self.history = 0, -1.0, []
        self.tau_chain = cfg.tau_chain or cfg.ttt_steps
        # Online, the target's forward is a quarter of a small draft's step: its layers compiled (the capture hooks
        # stay eager around them). Last in __init__, so nothing can fail after it before close() undoes it (the
        # caller may reuse an injected target).
        self._compiled_target = compiled and self.inp.source.online
        if self._compiled_target:
            from eyas.target.compiled import compile_layers
            compile_layers(lay, dynamic=False)

    def close(self) -> None:
        if self._compiled_target:
            from eyas.target.compiled import uncompile_layers
            uncompile_layers(self.inp.target.layout)
        D.shutdown(self.d)

    # ---- one forward/backward over a micro-batch -------------------------------------------------------
    def _forward(self, batch: dict):
        probs, ok, arg = self.head(batch["last"])
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            return self.model(batch["input_ids"], batch["position_ids"], batch["loss_mask"], batch["aux"],
                              probs, ok, arg)

    def train_step(self) -> tuple[torch.Tensor, int]:
        micro = self.plan.step_rows(self.step, self.d.rank)
        stats, tokens = None, 0
        for i, ids in enumerate(micro):
            batch = self.inp.source.batch(ids, self.device)
            tokens += int(batch["input_ids"].numel())
            sync = i == len(micro) - 1 or not hasattr(self.model, "no_sync")
            ctx = self.model.no_sync() if not sync else _null()
            with ctx:
                loss, st = self._forward(batch)
                (loss / len(micro)).backward()
            stats = st if stats is None else stats + st
        torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return self.d.all_reduce(stats.detach().clone()), tokens

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        batches = self.plan.eval_batches(self.d.rank, self.cfg.eval_batches)
        if not self.plan.eval_rows:
            return None
        was = self.model.training
        if not self._eval_as_step:   # the draft has no dropout or norm statistics: the mode changes no number
            self.model.eval()
        stats = torch.zeros(self.cfg.ttt_steps, 3, device=self.device)
        for ids in batches:
            # Under FSDP a forward is a collective: a rank without rows still runs one (on a held-out
            # row, not counted) so every rank issues the same all-gathers.
            use = ids or self.plan.eval_rows[:1]
            # Compiled: a short last batch is a new shape, graphs of its own (~30 s on an H200 at the first eval):
            # fill it up with held-out rows whose loss mask is cleared, so they count nothing
            fill = self.cfg.batch_size - len(use) if self._eval_as_step else 0
            use = use + [self.plan.eval_rows[i % len(self.plan.eval_rows)] for i in range(fill)]
            batch = self.inp.source.batch(use, self.device)
            if fill > 0:
                batch["loss_mask"][-fill:] = False
            with torch.set_grad_enabled(self._eval_as_step):   # the loss is dropped: no backward, nothing learned
                out = self._forward(batch)[1].detach().float()
            if ids:
                stats += out
        self.model.train(was)
        stats = self.d.all_reduce(stats)
        acc = step_accuracy(stats.cpu())
        return {"loss": self.kind.objective_value(stats, self.decay), "token_loss": token_loss(stats), "acc": acc,
                "tau": simulated_tau(acc, self.tau_chain),
                "positions": int(stats[0, 2])}

    # ---- checkpoints -----------------------------------------------------------------------------------
    def meta(self, metrics: dict | None) -> dict[str, Any]:
        return {"target": {**self.inp.target_meta, "sha256": self.target_sha}, "aux_layer_ids": self.inp.aux_ids,
                "train": self.cfg.model_dump(mode="json"), "metrics": metrics or {}, "step": self.step,
                "inputs": self.inp.describe()}

    def _diverged(self, what: str) -> str:
        last = C.latest_checkpoint(self.cfg.out)
        return (f"training diverged at step {self.step}: {what}; nothing made from it was saved"
                f"{f' (the last checkpoint, {last.name}, is finite)' if last else ''}. Lower --lr (now {self.cfg.lr}) "
                f"or --grad-clip, or check the target's hidden states (`eyas doctor --store`)")

    def _draft_for_save(self, msd: dict) -> torch.nn.Module:
        sd = {k[len("draft."):]: v for k, v in msd.items() if k.startswith("draft.")}
        bad = nonfinite_keys(sd)
        if bad:   # the loss of the step before may still have been finite: the update made them so
            raise TrainingDiverged(self._diverged(f"the draft's {', '.join(bad[:3])} hold NaN or inf values"))
        with torch.device("meta"):
            m = build_draft(self.draft.config)
        m.load_state_dict(sd, assign=True, strict=False)
        return m

    def save_checkpoint(self, metrics: dict | None) -> None:
        msd, osd = D.full_state(self.model, self.opt, self.d)
        if self.d.main:
            state = {"optimizer": osd, "scheduler": self.sched.state_dict(), "rng": C.rng_state(),
                     "step": self.step, "data_position": {"step": self.step, "rows_per_step": self.plan.rows_per_step},
                     "best_tau": self.best_tau, "history": self.history, "config": self.cfg.model_dump(mode="json")}
            C.save_checkpoint(self.cfg.out, self.step,
                              lambda d: save_draft(self._draft_for_save(msd), d, self.meta(metrics)),
                              state, self.cfg.keep_checkpoints)
        self.d.barrier()

    def resume(self) -> None:
        ck = C.latest_checkpoint(self.cfg.out)
        if ck is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.cfg.out / C.CHECKPOINTS}; "
                                    f"drop --resume to start a fresh run")
        st = C.load_state(ck)
        saved, now = resume_settings(st["config"]), resume_settings(self.cfg.model_dump(mode="json"))
        diff = [k for k in _RESUME_MUST_MATCH if saved[k] != now[k]]
        if diff:
            raise ConfigError(f"--resume from {ck}: {', '.join(f'{k}={saved.get(k)!r} (now {now.get(k)!r})' for k in diff)}"
                              " differ from the checkpoint; the run would not continue the same data order")
        from safetensors.torch import load_file
        msd = {"draft." + k: v for k, v in load_file(str(ck / "model.safetensors")).items()}
        D.load_full_state(self.model, self.opt, self.d, msd, st["optimizer"])
        self.sched.load_state_dict(st["scheduler"])
        C.set_rng_state(st["rng"])
        self.step, self.best_tau, self.history = st["step"], st["best_tau"], st["history"]

    # ---- the run ---------------------------------------------------------------------------------------
    def log(self, rec: dict) -> None:
        self.history.append(rec)
        if not self.d.main:
            return
        with open(self.cfg.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb is not None:
            split = rec["split"]
            for k in ("loss", "tau", "lr", "tokens_per_s"):
                if k in rec:
                    self.tb.add_scalar(f"{split}/{k}", rec[k], rec["step"])
            for i, a in enumerate(rec.get("acc", [])):
                self.tb.add_scalar(f"{split}/acc_{i}", a, rec["step"])

    def maybe_best(self, ev: dict) -> None:
        if ev["tau"] > self.best_tau:
            self.best_tau = ev["tau"]
            self.save_result({"best_step": self.step, **ev})

    def save_result(self, metrics: dict) -> None:
        """The RUN dir's own draft (the run's result): gathered from every rank (a collective), written by rank 0."""
        msd, _ = D.full_state(self.model, self.opt, self.d) if self.d.world > 1 else (self.unroll.state_dict(), None)
        if self.d.main:
            save_draft(self._draft_for_save(msd), self.cfg.out, self.meta(metrics))

    def run(self) -> dict:
        """Train into cfg.out, which `train` has claimed (eyas.outputs) on the main process."""
        cfg = self.cfg
        if self.d.main:
            C.clean_partial(cfg.out)
        self.d.barrier()
        if cfg.resume:
            self.resume()
            if self.d.main:  # steps after the checkpoint are trained (and logged) again
                C.truncate_metrics(cfg.out, self.step)
        if self.d.main:
            (cfg.out / "train_config.yaml").write_text(config_to_yaml(cfg))
        self.tb = _tensorboard(cfg.out / "tb", self.step) if (cfg.tensorboard and self.d.main) else None
        return self._loop()

    def _loop(self) -> dict:
        cfg = self.cfg
        bar = _progress(self.total, self.step, cfg.progress and self.d.main)
        self.model.train()
        window, t0, toks = None, time.perf_counter(), 0
        t_start = time.perf_counter()
        while self.step < self.total:
            st, n = self.train_step()
            if not bool(torch.isfinite(st).all()):
                raise TrainingDiverged(self._diverged(f"the loss is {token_loss(st)}"))
            window = st if window is None else window + st
            toks += n
            if bar is not None:
                bar.update(1)
                bar.note(f"loss {token_loss(st):.3f}, acc0 {float(st[0, 1] / st[0, 2].clamp(min=1)):.2f}")
            if self.step % cfg.log_every == 0 or self.step == self.total:
                dt = time.perf_counter() - t0
                acc = step_accuracy(window.cpu())
                self.log({"split": "train", "step": self.step, "loss": self.kind.objective_value(window, self.decay),
                          "token_loss": token_loss(window), "acc": acc,
                          "tau": simulated_tau(acc, self.tau_chain), "lr": self.sched.get_last_lr()[0],
                          "tokens_per_s": toks * self.d.world / max(dt, 1e-9)})
                window, t0, toks = None, time.perf_counter(), 0
            if self.step % cfg.eval_every == 0 or self.step == self.total or \
                    (cfg.eval_every_epoch and self.step % self.plan.steps_per_epoch == 0):
                ev = self.evaluate()
                if ev is not None:
                    self.log({"split": "eval", "step": self.step, **ev})
                    self.maybe_best(ev)
            if self.step % cfg.save_every == 0 or self.step == self.total:
                last = next((h for h in reversed(self.history) if h["split"] == "eval"), None)
                self.save_checkpoint(last)
        if bar is not None:
            bar.close()
        if self.best_tau < 0:  # no held-out split: the final weights are the result
            self.save_result({"best_step": self.step})
        if self.tb is not None:
            self.tb.close()
        evals = [h for h in self.history if h["split"] == "eval"]
        trains = [h for h in self.history if h["split"] == "train"]
        best = max(evals, key=lambda h: h["tau"]) if evals else None
        return {"out": str(cfg.out), "steps": self.step, "seconds": round(time.perf_counter() - t_start, 2),
                "best_tau": best["tau"] if best else None, "best_step": best["step"] if best else None,
                "eval": evals[-1] if evals else None, "train": trains[-1] if trains else None,
                "mode": "online" if self.inp.source.online else "offline"}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _tensorboard(path: Path, step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: metrics.jsonl still has everything
        return None
    # purge_step: on resume, events logged after the checkpoint are dropped (they are logged again)
    return SummaryWriter(str(path), purge_step=step or None)


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from eyas.progress import Progress
    return Progress("train", total, "steps", initial=initial)


def train(cfg: TrainConfig, *, target=None, store=None, dataset=None) -> dict:
    """Train and write the RUN dir; returns a summary. `target`/`store`/`dataset` inject in-memory
    objects (tests, the demo) in place of loading --target / --store / --data."""
    if cfg.resume and cfg.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: pick one")
    # the main process owns the RUN dir (its lock held to the end, its settings recorded)
    with claim(cfg.out, "run", overwrite=cfg.overwrite, resume=cfg.resume,
               inputs={"target": cfg.target, "store": cfg.store, "data": cfg.data},
               settings={k: getattr(cfg, k) for k in RUN_SETTINGS} | {"step_decay": step_decay(cfg)},
               defaults={k: TrainConfig.model_fields[k].default for k in RUN_SETTINGS}
               ) if dist_env()[0] == 0 else nullcontext():
        t = None
        try:
            t = Trainer(cfg, target=target, store=store, dataset=dataset)
            return t.run()
        except KeyboardInterrupt:   # wherever Ctrl-C lands: one line saying how to continue
            last = C.latest_checkpoint(cfg.out)
            raise C.Interrupted(f"interrupted at step {t.step if t is not None and hasattr(t, 'step') else 0}; "
                                + (f"continue from {last.name} with the same command plus --resume" if last else
                                   "no checkpoint was written yet: rerun with --overwrite to start over")) from None
        finally:
            if t is not None:
                t.close()


def run(cfg: TrainConfig) -> dict:
    if cfg.warm_only:
        from eyas.train.warm import warm_only

        return warm_only(cfg, train)
    return train(cfg)

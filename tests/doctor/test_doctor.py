"""`eyas doctor`: a healthy setup passes, a 1T wrapper config is checked in seconds, and each injected fault fails
with a message naming the problem. Targets are config + tokenizer dirs (doctor never needs weights)."""

import importlib.util
import json
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from eyas import doctor
from eyas.doctor import DoctorConfig, diagnose
from eyas.engines.vllm import entry_points_for

_spec = importlib.util.spec_from_file_location("fake_engine", Path(__file__).parents[1] / "engines/data/fake_engine.py")
fake_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_engine)

LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
TOKENS = ["<unk>", "<s>", "</s>"] + LETTERS + ["Ġ"] + ["Ġ" + c for c in LETTERS] + ["?", "."]
VOCAB = len(TOKENS)  # 110
TEMPLATE = "{% for m in messages %}<s>{{ m.role }} {{ m.content }}</s>{% endfor %}"
NO_ASSISTANT = "{% for m in messages %}{% if m.role != 'assistant' %}<s>{{ m.role }} {{ m.content }}</s>{% endif %}" \
               "{% endfor %}"


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = models.BPE(vocab={t: i for i, t in enumerate(TOKENS)}, merges=[("Ġ", c) for c in LETTERS], unk_token="<unk>")
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    t.chat_template = TEMPLATE
    return t


def llama_config(vocab=VOCAB, layers=6):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       architectures=["LlamaForCausalLM"])


def write_target(path: Path, config) -> str:
    config.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("target"), llama_config())


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"what is {w}?"},
                          {"role": "assistant", "content": f"it is a {w}."}]} for w in ("cat", "dog", "sun", "sky")]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    return str(p)


def make_draft(path: Path, aux=(2, 3, 4), vocab=VOCAB, draft_vocab=40) -> Path:
    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target

    from eyas.vocab import build_draft_vocab

    dc = draft_config_from_target(llama_config(vocab=vocab), aux_layer_ids=list(aux), draft_vocab_size=draft_vocab)
    model = Eagle3Draft(dc)
    d2t, t2d, _ = build_draft_vocab(torch.arange(vocab, 0, -1), draft_vocab)
    model.set_vocab_map(d2t, t2d)
    return save_draft(model, path, {"target": "tiny"})


def failures(checks):
    return {c.name: c.detail for c in checks if c.status == "fail"}


def test_healthy_setup_passes(target, chats, tmp_path, capsys):
    draft = make_draft(tmp_path / "draft")
    cfg = DoctorConfig(target=target, data=chats, draft=draft, max_samples=100, max_length=64, store=tmp_path / "st",
                       gpu_memory_gib=80, json=True)
    assert doctor.run(cfg) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["failed"] == []
    names = {c["name"]: c["status"] for c in doc["checks"]}
    for name in ("decoder layers", "aux layer ids", "hidden size / vocab", "chat template / loss mask",
                 "dataset schema", "loss mask on data", "draft vs target", "disk for store",
                 "GPU memory: extraction", "GPU memory: training (offline)"):
        assert names[name] == "pass", name


def test_table_output_and_exit_code(target, capsys):
    assert doctor.run(DoctorConfig(target=target, aux_layer_ids=[1, 99])) == 1
    text = capsys.readouterr().out
    assert "FAIL  aux layer ids" in text and "fix:" in text and "1 failed" in text


def kimi_k2_in_llava():
    """A Kimi-K2 / DeepSeek-V3-sized MoE (61 layers, hidden 7168, 384 routed experts, MLA) in a Llava wrapper."""
    from transformers import CLIPVisionConfig, DeepseekV3Config, LlavaConfig

    text = DeepseekV3Config(vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                            num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1,
                            n_routed_experts=384, num_experts_per_tok=8, first_k_dense_replace=1, q_lora_rank=1536,
                            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                            max_position_embeddings=131072)
    vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=16)
    return LlavaConfig(vision_config=vision, text_config=text, architectures=["LlavaForConditionalGeneration"])


def test_trillion_parameter_wrapper_config_in_seconds(tmp_path):
    # Import the modelling modules first: the budget is the doctor's work, not Python importing transformers
    # on a loaded machine (the CLI's own startup is measured separately, see the report).
    from transformers import DeepseekV3ForCausalLM, LlavaForConditionalGeneration  # noqa: F401

    path = write_target(tmp_path / "k2", kimi_k2_in_llava())
    cfg = DoctorConfig(target=path, max_samples=100_000, max_length=4096, gpus=8, gpu_memory_gib=141, store=tmp_path)
    t0 = time.perf_counter()
    checks = diagnose(cfg)
    seconds = time.perf_counter() - t0
    by = {c.name: c for c in checks}
    assert "model.language_model.layers (61 x DeepseekV3DecoderLayer" in by["decoder layers"].detail
    assert by["aux layer ids"].detail.startswith("[2, 30, 58]")
    params = float(by["hidden size / vocab"].detail.split("vocab 163840, ")[1].split("B")[0].replace(",", ""))
    assert 0.95e3 < params < 1.1e3, params  # ~1T parameters, counted on the meta device
    assert "hidden 7168" in by["hidden size / vocab"].detail
    # 1T bf16 params over 8 x 141 GiB do not fit: the doctor says so instead of an OOM 18 minutes in.
    assert by["GPU memory: extraction"].status == "fail"
    assert "409,600,000 tokens x 57,353 B/token" in by["disk for store"].detail  # (3 aux + last) x 7168 x bf16
    assert seconds < 10, f"doctor took {seconds:.1f}s on the 1T config"


def test_fp8_checkpoint_halves_the_weight_estimate(tmp_path):
    config = kimi_k2_in_llava()
    config.text_config.quantization_config = {"quant_method": "fp8", "fmt": "e4m3"}
    path = write_target(tmp_path / "k2fp8", config)
    by = {c.name: c for c in diagnose(DoctorConfig(target=path, gpus=8, gpu_memory_gib=141))}
    assert by["GPU memory: extraction"].status == "pass", by["GPU memory: extraction"].detail


def test_cli_flags_and_exit_code(target, capsys):
    from eyas.cli import main

    assert main(["doctor", "--target", target, "--aux-layer-ids", "1", "2", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    assert main(["doctor", "--target", target, "--aux-layer-ids", "1", "77"]) == 1


# --- fault injection: one each, every one fails naming the problem

def test_wrong_layer_path(tmp_path):
    from transformers import CLIPVisionConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=16)
    wrapped = write_target(tmp_path / "llava", LlavaConfig(vision_config=vision, text_config=llama_config(),
                                                           architectures=["LlavaForConditionalGeneration"]))
    bad = failures(diagnose(DoctorConfig(target=wrapped, layers_path="model.layers")))
    assert "model.layers does not exist" in bad["layer path"]
    assert "model.language_model.layers" in bad["layer path"]


def test_undiscoverable_decoder(target, monkeypatch):
    from torch import nn

    class Odd(nn.Module):  # embedding and lm_head, but no list of blocks next to the embedding
        def __init__(self):
            super().__init__()
            self.embed, self.lm_head = nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB)

        def get_input_embeddings(self):
            return self.embed

    monkeypatch.setattr("eyas.doctor.target.build_meta", lambda config: Odd())
    assert "no text decoder found" in failures(diagnose(DoctorConfig(target=target)))["decoder layers"]


def test_aux_id_out_of_range(target):
    bad = failures(diagnose(DoctorConfig(target=target, aux_layer_ids=[2, 3, 9])))
    assert "[9] out of range" in bad["aux layer ids"] and "6 decoder layers" in bad["aux layer ids"]


def test_aux_count_differs_from_fc_width(target, tmp_path):
    draft = make_draft(tmp_path / "draft", aux=(2, 3, 4))
    bad = failures(diagnose(DoctorConfig(target=target, draft=draft, aux_layer_ids=[1, 2, 3, 4])))
    assert "aux count != fc width: 4 aux layers x hidden 32 = 128, but fc.weight takes 96" in bad["draft vs target"]


def test_template_without_assistant_turns(target, tmp_path):
    tpl = tmp_path / "tpl.jinja"
    tpl.write_text(NO_ASSISTANT)
    bad = failures(diagnose(DoctorConfig(target=target, chat_template=tpl)))
    assert "assistant" in bad["chat template / loss mask"] and str(tpl) in bad["chat template / loss mask"]


def test_draft_target_vocab_mismatch(target, tmp_path):
    draft = make_draft(tmp_path / "draft", vocab=VOCAB + 8)
    bad = failures(diagnose(DoctorConfig(target=target, draft=draft)))
    assert f"vocab mismatch: the draft was built for a {VOCAB + 8}-token target vocabulary" in bad["draft vs target"]


def test_changed_engine_entry_point_signature(target, tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path, replace={
        ("vllm/entrypoints/llm.py", "prompts, sampling_params=None, *,"): "prompts, *, sampling_params=None,"})
    bad = failures(diagnose(DoctorConfig(target=target, engine="vllm", python=str(py))))
    assert "no longer takes positional parameter `sampling_params`" in bad["engine: vllm.LLM.generate"]
    n = len(entry_points_for())   # a Llama target: no architecture's own entry points
    assert f"{n - 1}/{n} vLLM entry points bind" in bad["engine: entry points"]


def test_healthy_fake_engine_passes(target, tmp_path):
    py = fake_engine.make_fake_vllm(tmp_path)
    checks = {c.name: c for c in diagnose(DoctorConfig(target=target, engine="vllm", python=str(py)))}
    assert checks["engine: vllm version"].status == "pass"
    assert checks["engine: entry points"].status == "pass"


def test_not_enough_disk(target, tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(doctor.resources.shutil, "disk_usage", lambda p: Usage(1 << 40, (1 << 40) - (1 << 20), 1 << 20))
    bad = failures(diagnose(DoctorConfig(target=target, max_samples=1000, max_length=512, store=tmp_path / "new")))
    assert "512,000 tokens" in bad["disk for store"] and "GiB free" in bad["disk for store"]


def test_corrupted_store_shard(target, tmp_path):
    from transformers import LlamaForCausalLM

    from eyas.data.dataset import PreparedDataset, PreparedWriter, write_manifest, write_vocab
    from eyas.vocab import build_draft_vocab
    from eyas.store import target_identity
    from eyas.store.extract import extract_to_store
    from eyas.target import wrap_model

    prep = tmp_path / "prep"
    prep.mkdir()
    w = PreparedWriter(prep, shard_rows=2)
    g = torch.Generator().manual_seed(0)
    for n in (12, 9, 16, 7):
        w.add([(torch.randint(0, VOCAB, (n,), generator=g).numpy(), (torch.arange(n) >= n // 2).numpy())])
    w.flush()
    write_vocab(prep, *build_draft_vocab(torch.ones(VOCAB, dtype=torch.int64), 40)[:2], torch.ones(VOCAB).long())
    write_manifest(prep, {"format": "eyas-prepared", "format_version": 1, "target": {"name": "tiny", "vocab_size": VOCAB},
                          "max_length": 16, "shards": w.shards, "summary": {"rows": 4}})
    config = llama_config()
    t = wrap_model(LlamaForCausalLM(config).eval())
    ident = target_identity("tiny", config, [2, 3, 4], "bf16", hidden_size=32, num_layers=6, vocab_size=VOCAB)
    store = tmp_path / "store"
    extract_to_store(t.model, t.layout, PreparedDataset(prep), store, identity=ident, shard_mb=0.001)
    healthy = diagnose(DoctorConfig(target=target, store=store, data=str(prep), aux_layer_ids=[2, 3, 4]))
    assert not failures(healthy) and "store vs data" not in {c.name for c in healthy}
    (prep / "manifest.json").write_text((prep / "manifest.json").read_text().replace('"rows": 4', '"rows": 5'))
    stale = {c.name: c for c in diagnose(DoctorConfig(target=target, store=store, data=str(prep),
                                                      aux_layer_ids=[2, 3, 4]))}
    assert stale["store vs data"].status == "warn"
    shard = sorted(store.glob("shard-*.safetensors"))[-1]
    raw = bytearray(shard.read_bytes())
    raw[-20:] = bytes(20)  # bit rot in the last tensor's data
    shard.write_bytes(bytes(raw))
    bad = failures(diagnose(DoctorConfig(target=target, store=store, aux_layer_ids=[2, 3, 4])))
    assert shard.name in bad["store"] and "corrupted" in bad["store"]


def test_vllm_export_is_checked_against_the_target(target, tmp_path):
    from eyas.export import export_vllm

    draft = make_draft(tmp_path / "draft")
    out = export_vllm(draft, tmp_path / "export", verifier=target)
    checks = {c.name: c for c in diagnose(DoctorConfig(target=target, draft=out))}
    assert checks["draft vs target"].status == "pass", checks["draft vs target"].detail
    assert "speculators export" in checks["draft vs target"].detail
    bad = failures(diagnose(DoctorConfig(target=target, draft=out, aux_layer_ids=[1, 2])))
    assert "fc width" in bad["draft vs target"]


def test_sglang_export_is_read_in_eyas_conventions(target, tmp_path):
    from eyas.draft.io import save_draft
    from eyas.draft.model import Eagle3Draft, draft_config_from_target
    from eyas.export import export_sglang

    # SGLang's midlayer keeps the residual before hidden_norm; its aux ids are stored shifted by one.
    dc = draft_config_from_target(llama_config(), aux_layer_ids=[2, 3, 4], draft_vocab_size=VOCAB,
                                  norm_before_residual=False)
    out = export_sglang(save_draft(Eagle3Draft(dc), tmp_path / "draft", {"target": "tiny"}), tmp_path / "sg",
                        verifier=target)
    by = {c.name: c for c in diagnose(DoctorConfig(target=target, draft=out))}
    assert by["draft vs target"].status == "pass", by["draft vs target"].detail
    assert by["aux layer ids"].detail.startswith("[2, 3, 4] from the draft")


def test_prepared_dir_vocab_coverage(target, tmp_path):
    from eyas.data.dataset import PreparedWriter, write_manifest, write_vocab
    from eyas.vocab import build_draft_vocab

    prep = tmp_path / "prep"
    prep.mkdir()
    w = PreparedWriter(prep, shard_rows=4)
    w.add([(torch.arange(10).numpy(), (torch.arange(10) >= 5).numpy())])
    w.flush()
    freq = torch.zeros(VOCAB, dtype=torch.int64)
    freq[:20] = 5
    d2t, t2d, _ = build_draft_vocab(freq, 10)
    write_vocab(prep, d2t, t2d, freq)
    write_manifest(prep, {"format": "eyas-prepared", "format_version": 1, "target": {"name": "tiny", "vocab_size": VOCAB},
                          "max_length": 16, "shards": w.shards, "summary": {"rows": 1, "tokens": 10}})
    checks = {c.name: c for c in diagnose(DoctorConfig(target=target, data=str(prep)))}
    assert checks["dataset schema"].status == "pass"
    cov = checks["draft vocab coverage"]
    assert cov.status == "warn" and "10 draft tokens cover 50.0%" in cov.detail
    assert "10 tokens x" in checks["disk for store"].detail  # the store is sized from the PREPARED summary


def test_truncated_target_weights_fail(tmp_path):
    # item 13: doctor passed a target whose weights were cut short.
    from transformers import LlamaForCausalLM
    t = Path(write_target(tmp_path / "t", llama_config()))
    LlamaForCausalLM(llama_config()).save_pretrained(t)
    names = {c.name: c.status for c in diagnose(DoctorConfig(target=str(t)))}
    assert names["target weights"] == "pass"
    w = t / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1000])
    assert "cut short" in failures(diagnose(DoctorConfig(target=str(t))))["target weights"]


def test_an_unwritable_store_location_fails(target, tmp_path, monkeypatch):
    # item 13: doctor passed a --store nobody can write (checked with access(2); this test runs as root, so the
    # answer for a read-only directory is stood in).
    ro = tmp_path / "ro"
    ro.mkdir()
    real = doctor.resources.os.access
    monkeypatch.setattr(doctor.resources.os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    got = failures(diagnose(DoctorConfig(target=target, store=ro / "store", max_samples=10, max_length=64)))
    assert "not writable" in got["store location"]


def test_stop_tokens_check_names_a_tokenizer_and_template_that_disagree_with_the_config(tmp_path):
    """A tiny Qwen2 whose config stops on </s> (2) while its tokenizer calls <s> (1) eos: warned, naming both; an
    assistant turn ending in a token that is no stop id is named too; the agreeing tokenizer passes."""
    from tests.target.fixtures import tiny_qwen2, tiny_tokenizer

    tiny_qwen2(seed=1, hidden=64).save_pretrained(tmp_path)
    tok = tiny_tokenizer()
    cfg = DoctorConfig(target=str(tmp_path))
    ids, mask = torch.tensor([1, 5, 6, 2, 1, 7, 8, 2]), torch.tensor([0, 0, 0, 0, 0, 1, 1, 1]).bool()
    out = []
    doctor.check_stops(cfg, tok, ids, mask, out)
    assert (out[0].name, out[0].status) == ("stop tokens", "pass") and "2 '</s>'" in out[0].detail
    tok.eos_token = "<s>"
    doctor.check_stops(cfg, tok, ids, torch.tensor([0, 0, 0, 0, 0, 1, 1, 0]).bool(), out)
    assert out[1].status == "warn" and "the tokenizer's eos is 1 '<s>', not a stop id" in out[1].detail
    assert "the template ends assistant turns with 8 " in out[1].detail

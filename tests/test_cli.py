import json

from eyas import __version__
from eyas.cli import COMMANDS, main


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_inspect_json_on_local_dir(tmp_path, capsys):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    assert main(["inspect", "--target", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_layers"] == 8 and info["hidden_size"] == 64 and info["vocab_size"] == 256
    assert info["default_aux_layer_ids"] == [2, 4, 5]
    assert info["layers_path"] == "model.layers"


def test_bad_target_is_one_clear_error(tmp_path, capsys):
    assert main(["inspect", "--target", str(tmp_path / "missing")]) == 1
    assert "missing" in capsys.readouterr().err


def test_unknown_yaml_key_fails(tmp_path, capsys):
    y = tmp_path / "c.yaml"
    y.write_text("target: x\nbogus_key: 1\n")
    assert main(["inspect", "--config", str(y)]) == 2
    assert "bogus_key" in capsys.readouterr().err


def _tiny_llama_dir(path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(path)
    return path


def test_inspect_table_names_every_field(tmp_path, capsys):
    assert main(["inspect", "--target", str(_tiny_llama_dir(tmp_path))]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    for key in ("architecture", "layers_path", "num_layers", "hidden_size", "vocab_size", "default_aux_layer_ids",
                "num_parameters", "dtype"):
        assert key in rows
    assert rows["layers_path"] == "model.layers" and rows["default_aux_layer_ids"] == "[2, 4, 5]"


def test_inspect_from_yaml_and_flag_overrides(tmp_path, capsys):
    d = _tiny_llama_dir(tmp_path / "m")
    y = tmp_path / "c.yaml"
    y.write_text(f"target: {tmp_path / 'missing'}\njson: true\n")
    assert main(["inspect", "--config", str(y), "--target", str(d)]) == 0  # the flag wins over the file
    assert json.loads(capsys.readouterr().out)["num_layers"] == 8

"""lab/vllm_closure.py: the packages and names vLLM's modules import at import time, against the carried wheels and
the image's packages (a missing one is named with the chain of modules that reaches it)."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{path.name.split('-')[0]}-1.0.dist-info/METADATA", "Name: x\n")
    return path


def _run(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "closure.json"
    image = tmp_path / "image.txt"
    image.write_text("# the image\npillow\nnumpy\n")
    p = subprocess.run([sys.executable, str(ROOT / "lab" / "vllm_closure.py"), "--vllm", str(tmp_path / "vtree"),
                        "--image", str(image), "--paths", "--json", str(out), *args],
                       capture_output=True, text=True)
    return p.returncode, json.loads(out.read_text()) if out.exists() else {}, p.stdout + p.stderr


def test_an_eager_import_of_an_absent_package_is_named_with_its_chain(tmp_path):
    _write(tmp_path / "vtree", {
        "vllm/__init__.py": "",
        "vllm/models/__init__.py": "",
        "vllm/models/kimi.py": "import numpy\nfrom PIL import Image\nfrom ..quant import q\n",
        "vllm/quant.py": "import carried\nq = 1\n",
    })
    site = tmp_path / "site"
    site.mkdir()
    _wheel(site / "carried-1.0-py3-none-any.whl", {"carried/__init__.py": "from carried.log import logger\n",
                                                   "carried/log.py": "import loguru\nlogger = 1\n"})
    rc, rep, text = _run(tmp_path, "--site", str(site), "--module", "vllm.models.kimi")
    assert rc == 1, text
    assert rep["extra"]["missing"] == {"loguru": ["vllm.models.kimi", "vllm.quant", "carried", "carried.log",
                                                  "line 1"]}
    assert "MISSING loguru" in text


def test_guarded_lazy_and_conditional_imports_are_not_followed(tmp_path):
    _write(tmp_path / "vtree", {
        "vllm/__init__.py": "",
        "vllm/a.py": (
            "import sys\nfrom contextlib import suppress\nfrom typing import TYPE_CHECKING\n"
            "try:\n    import fast_json\nexcept ImportError:\n    import slow_json\n"
            "with suppress(ImportError):\n    import maybe_here\n"
            "if TYPE_CHECKING:\n    import typing_only\n"
            "if sys.platform == 'tpu':\n    import libtpu\n"
            "def f():\n    import deep_ep\n"
            "class C:\n    import numpy\n"),
    })
    rc, rep, text = _run(tmp_path, "--module", "vllm.a")
    assert rc == 0, text
    assert rep["extra"]["missing"] == {}
    assert set(rep["extra"]["lazy_unprovided"]) == {"libtpu", "deep_ep"}


def test_a_name_the_imported_module_lacks_is_named(tmp_path):
    _write(tmp_path / "vtree", {
        "vllm/__init__.py": "",
        "vllm/pixtral.py": ("from transformers.models.pixtral.modeling_pixtral import (PixtralRotaryEmbedding, "
                            "apply_rotary_pos_emb)\nfrom carried.star import anything\nfrom carried import sub\n"),
    })
    _write(tmp_path / "site", {"carried/__init__.py": "", "carried/sub.py": "",
                               "carried/star.py": "from carried.sub import *\n"})
    _write(tmp_path / "tf", {
        "transformers/__init__.py": "",
        "transformers/models/__init__.py": "",
        "transformers/models/pixtral/__init__.py": "",
        "transformers/models/pixtral/modeling_pixtral.py": (
            "class PixtralVisionRotaryEmbedding:\n    pass\n\ndef apply_rotary_pos_emb(q, k):\n    return q\n"),
    })
    (tmp_path / "img.txt").write_text("transformers\n")
    rc, rep, text = _run(tmp_path, "--site", str(tmp_path / "site"), "--names", str(tmp_path / "tf"),
                         "--image", str(tmp_path / "img.txt"), "--module", "vllm.pixtral")
    assert rc == 1, text
    assert list(rep["extra"]["missing_names"]) == ["transformers.models.pixtral.modeling_pixtral: "
                                                   "PixtralRotaryEmbedding"]
    assert rep["extra"]["missing"] == {}


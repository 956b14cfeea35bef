"""Which packages (and names) vLLM's modules on a path import, against what the GPU machine will have: the carried
wheels and the image's own packages. Static (the AST of every module reached; nothing is imported), so it runs here
before a session, on the tree and wheels `lab/gpu_carry.sh pack` stages.

    python3 lab/vllm_closure.py --vllm STAGE/vtree --site DIR [--site DIR ...] [--image lab/h200-image-packages.txt]
        [--names DIR ...] [--paths kimi llava ...] [--module M ...] [--json OUT]

--site: a folder of carried wheels (*.whl, read in place) or of unpacked packages; --names: an unpacked package of
the image at its version (e.g. transformers 5.17's `transformers/` parent) whose module-level names are checked
against every `from M import NAME` that reaches it.
Edges: an import at module level (class bodies included) runs when its module is imported: such "eager" imports are
followed; one inside `try: ... except ImportError` (or Exception) is optional, and one inside a function runs only
on some branch ("lazy"), one under a module-level `if` on a platform, version or setting ("conditional"): none of
these is followed, but a lazy or conditional import of a package nobody provides is listed as a warning.
Exit 1 when an eager import is missing (a package, a module of a carried package, or a name in --names); the report
names the chain of modules that reaches it.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import zipfile
from collections import deque
from pathlib import Path

# The modules each vLLM path of eyas loads (kimi_toy's steps): the model files, what the engine picks at run time
# on an H200 (attention backends, the MoE experts, the drafter), and the worker-facing entry points.
_CORE = ["vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.engine.llm_engine",
         "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.model_executor.models.registry",
         "vllm.v1.attention.backends.flash_attn", "vllm.v1.sample.ops.topk_topp_sampler",
         "vllm.v1.spec_decode.eagle", "vllm.model_executor.models.llama_eagle3",
         "vllm.transformers_utils.configs.speculators.base",
         "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"]
PATHS = {
    "kimi": _CORE + ["vllm.model_executor.models.kimi_k25", "vllm.model_executor.models.kimi_k25_vit",
                     "vllm.model_executor.models.deepseek_v2", "vllm.transformers_utils.configs.kimi_k25",
                     "vllm.transformers_utils.processors.kimi_k25_vision_fused",
                     "vllm.v1.attention.backends.mla.flashattn_mla", "vllm.v1.attention.backends.mla.flashmla",
                     "vllm.v1.attention.backends.mla.triton_mla", "vllm.v1.attention.backends.mla.prefill.flash_attn",
                     "vllm.v1.attention.ops.flashmla", "vllm.model_executor.layers.fused_moe.layer",
                     "vllm.model_executor.layers.fused_moe.experts.triton_moe",
                     "vllm.model_executor.layers.fused_moe.oracle.unquantized"],
    "llava": _CORE + ["vllm.model_executor.models.llava", "vllm.model_executor.models.llama",
                      "vllm.model_executor.models.clip"],
    "llama": _CORE + ["vllm.model_executor.models.llama"],
    # session C: SmolLM2 with P-EAGLE (parallel drafting in the EAGLE proposer) and DFlash (its own proposer, model)
    "drafters": _CORE + ["vllm.model_executor.models.llama", "vllm.v1.spec_decode.dflash",
                         "vllm.model_executor.models.qwen3_dflash",
                         "vllm.transformers_utils.configs.speculators.algos"],
}
# Distribution name -> the top-level modules it installs, where they differ from the name (lower case, - -> _).
DIST_MODULES = {
    "absl-py": ["absl"], "attrs": ["attr", "attrs"], "cuda-bindings": ["cuda"], "cuda-core": ["cuda"],
    "cuda-pathfinder": ["cuda"], "cuda-python": ["cuda"], "cupy-cuda13x": ["cupy", "cupyx", "cupy_backends"],
    "hf-xet": ["hf_xet"], "jax-cuda13-pjrt": ["jax_plugins"], "jax-cuda13-plugin": ["jax_plugins"],
    "lazy-loader": ["lazy_loader"], "markdown-it-py": ["markdown_it"], "nvidia-ml-py": ["pynvml"],
    "opencv-python-headless": ["cv2"], "pillow": ["PIL"], "protobuf": ["google"], "py-cpuinfo": ["cpuinfo"],
    "pyyaml": ["yaml"], "python-dateutil": ["dateutil"], "scikit-learn": ["sklearn"], "scikit-image": ["skimage"],
    "setuptools": ["setuptools", "pkg_resources", "_distutils_hack"], "pytorch-lightning": ["pytorch_lightning"],
    "sentence-transformers": ["sentence_transformers"], "tensorboard-data-server": ["tensorboard_data_server"],
    "pyre-extensions": ["pyre_extensions"], "typing-extensions": ["typing_extensions"],
    "msgpack": ["msgpack"], "pyzmq": ["zmq"], "python-json-logger": ["pythonjsonlogger"],
    "lm-format-enforcer": ["lmformatenforcer"], "rpds-py": ["rpds"], "apache-tvm-ffi": ["tvm_ffi"],
    "flashinfer-python": ["flashinfer"], "opt-einsum": ["opt_einsum"], "ml-dtypes": ["ml_dtypes"],
    "nvidia-cublas": ["nvidia"], "nvidia-cuda-runtime": ["nvidia"], "nvidia-nccl-cu13": ["nvidia"],
    "nvidia-cudnn-cu13": ["nvidia"], "nvidia-cuda-nvrtc": ["nvidia"], "nvidia-nvjitlink": ["nvidia"],
}
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def dist_modules(dist: str) -> list[str]:
    d = dist.strip().lower().replace("_", "-")
    return DIST_MODULES.get(d, [d.replace("-", "_").replace(".", "_")])


class Tree:
    """Source files by module name, from folders and wheels (read in place); a module is `a/b.py`, `a/b/__init__.py`
    or an extension `a/b.*.so` (present, not parsed)."""

    def __init__(self):
        self.files: dict[str, tuple[str, object]] = {}   # module -> (kind "py" | "so" | "pkg", loader)
        self.tops: dict[str, str] = {}                    # top-level name -> where it comes from
        self.prefixes: set[str] = set()                   # every module and package, for has()
        self._names: dict[str, set[str] | None] = {}

    def add(self, root: Path, label: str) -> None:
        if not root.exists():
            raise SystemExit(f"{root}: no such folder or wheel")
        if root.is_dir() and any(root.glob("*.whl")):
            for whl in sorted(root.glob("*.whl")):
                self.add(whl, whl.name)
            return
        if root.suffix == ".whl":
            z = zipfile.ZipFile(root)
            names = z.namelist()
            read = lambda n, z=z: z.read(n).decode("utf-8", "replace")  # noqa: E731
        else:
            names = [str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".py", ".so")]
            read = lambda n, r=root: (r / n).read_text("utf-8", "replace")  # noqa: E731
        for n in names:
            parts = n.split("/")
            if parts[0].endswith((".dist-info", ".data")) or not n.endswith((".py", ".so")):
                continue
            stem = parts[-1].split(".")[0]
            mod = ".".join(parts[:-1] + ([] if stem == "__init__" else [stem]))
            kind = "so" if n.endswith(".so") else ("pkg" if stem == "__init__" else "py")
            if mod and (mod not in self.files or kind != "so"):
                self.files[mod] = (kind, (lambda n=n, read=read: read(n)))
                self.tops.setdefault(parts[0].split(".")[0], label)
                self.prefixes.update(".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 2))

    def has(self, mod: str) -> bool:
        return mod in self.prefixes

    def names(self, mod: str) -> set[str] | None:
        """A plain module's top-level names (None: a package, an extension, or names made at run time)."""
        if mod not in self._names:
            src = self.source(mod)
            self._names[mod] = defined_names(src[1]) if src and src[0] == "py" else None
        return self._names[mod]

    def source(self, mod: str) -> tuple[str, str] | None:
        got = self.files.get(mod)
        return (got[0], got[1]()) if got and got[0] != "so" else None


def imports(mod: str, kind: str, text: str) -> list[tuple[str, tuple[str, ...], str, int]]:
    """(module, names imported from it, "eager" | "optional" | "lazy", line) for every import in one file."""
    pkg = mod if kind == "pkg" else mod.rpartition(".")[0]
    out = []

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = pkg.split(".")
        base = base[:len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def walk(nodes, how):
        guarded = "optional" if how == "eager" else how
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                walk(node.body if isinstance(node.body, list) else [], "lazy" if how == "eager" else how)
            elif isinstance(node, ast.Import):
                out.extend((a.name, (), how, node.lineno) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                out.append((absolute(node), tuple(a.name for a in node.names), how, node.lineno))
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" in ast.unparse(node.test):
                    walk(node.orelse, how)
                else:   # a platform, version or setting decides: not followed, absent packages listed
                    walk(node.body + node.orelse, "conditional" if how == "eager" else how)
            elif isinstance(node, ast.Try):
                caught = {c.strip("() ") for h in node.handlers
                          for c in (ast.unparse(h.type) if h.type is not None else "BaseException").split(",")}
                walk(node.body, guarded if {c.split(".")[-1] for c in caught} & GUARDS else how)
                walk(node.orelse + node.finalbody, how)
                for h in node.handlers:   # a fallback runs only when the guarded part failed
                    walk(h.body, guarded)
            elif isinstance(node, ast.With) and any("suppress" in ast.unparse(i.context_expr) for i in node.items):
                walk(node.body, guarded)
            else:
                walk([c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)], how)

    walk(ast.parse(text).body, "eager")
    return out


def defined_names(text: str | list) -> set[str] | None:
    """A module's top-level names; None when others may resolve (a module __getattr__, a star import, globals())."""
    if isinstance(text, str) and "globals()" in text:
        return None
    names = set()
    for node in ast.parse(text).body if isinstance(text, str) else text:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body = [s for s in ast.iter_child_nodes(node) if isinstance(s, ast.stmt)]
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
            sub = defined_names(body)
            if sub is None:
                return None
            names |= sub
    return names


def closure(start: list[str], tree: Tree, image: set[str], names: Tree | None = None) -> dict:
    """Follow eager imports from `start`; every import no one provides, with the chain that reaches it."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    parent: dict[str, str | None] = {m: None for m in start}
    queue, seen = deque(start), set()
    missing, lazy, bad_names = {}, {}, {}

    def chain(m: str) -> list[str]:
        out = []
        while m is not None:
            out.append(m)
            m = parent.get(m)
        return out[::-1]

    def provided(top: str) -> bool:
        return top in stdlib or top in image or top in tree.tops

    while queue:
        mod = queue.popleft()
        if mod in seen:
            continue
        seen.add(mod)
        src = tree.source(mod)
        if src is None:
            continue
        for target, froms, how, line in imports(mod, *src):
            top = target.split(".")[0]
            where = f"{mod}:{line}"
            if how in ("lazy", "conditional"):
                if not provided(top):
                    lazy.setdefault(top, where)
                continue
            if how == "optional" or top in stdlib:
                continue
            where_from = tree if top in tree.tops else names if top in image and names is not None else None
            have = where_from.names(target) if where_from is not None and froms else None
            gone = [n for n in froms if have is not None and n not in have and n != "*"
                    and not where_from.has(f"{target}.{n}")]
            if gone:
                bad_names.setdefault(f"{target}: {', '.join(gone)}", chain(mod) + [f"line {line}"])
            if top not in tree.tops:
                if top not in image:
                    missing.setdefault(target, chain(mod) + [f"line {line}"])
                continue
            parts = target.split(".")
            mods = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
            mods += [f"{target}.{n}" for n in froms if tree.has(f"{target}.{n}")]
            if not tree.has(target):
                missing.setdefault(target, chain(mod) + [f"line {line}"])
                continue
            for m in mods:
                if m not in parent:
                    parent[m] = mod
                queue.append(m)
    return {"modules": len(seen), "missing": missing, "missing_names": bad_names,
            "lazy_unprovided": dict(sorted(lazy.items()))}


def main(argv=None) -> int:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", type=Path, required=True, help="vLLM's unpacked wheel (the folder holding vllm/)")
    ap.add_argument("--site", type=Path, action="append", default=[], help="carried wheels or unpacked packages")
    ap.add_argument("--image", type=Path, default=here / "h200-image-packages.txt")
    ap.add_argument("--names", type=Path, action="append", default=[], help="an image package's source at its version")
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--module", action="append", default=[], help="another start module")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    tree = Tree()
    tree.add(a.vllm, "vllm")
    for s in a.site:
        tree.add(s, str(s))
    image = {m for line in a.image.read_text().splitlines() if line.strip() and not line.startswith("#")
             for m in dist_modules(line)}
    names = None
    if a.names:
        names = Tree()
        for n in a.names:
            names.add(n, str(n))
    report, bad = {}, 0
    for p in a.paths + (["extra"] if a.module else []):
        res = closure(PATHS.get(p, a.module), tree, image, names)
        report[p] = res
        bad += len(res["missing"]) + len(res["missing_names"])
        print(f"{p}: {res['modules']} modules; missing {len(res['missing'])}, missing names "
              f"{len(res['missing_names'])}, lazy imports of absent packages {len(res['lazy_unprovided'])}")
        for what, ch in {**res["missing"], **res["missing_names"]}.items():
            print(f"  MISSING {what}  <- {' -> '.join(ch)}")
        if res["lazy_unprovided"]:
            print("  lazy (runs on some branches only): " + ", ".join(f"{k} ({v})" for k, v in
                                                                       res["lazy_unprovided"].items()))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The `eyas` command: parse, call one library function, print. `main(argv) -> int` is testable.

Every subcommand is a (module, Config class, run function) triple. A module is imported only when
its command runs; `eyas --help`, `eyas --version` and `eyas CMD --help` import neither torch nor the
stage (see cli_help.py). The CPU thread policy is set here, before anything imports torch (threads.py).
The run function takes the validated config and returns an exit code (int) or a JSON-able summary.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from typing import Any

from eyas import __version__, env

# name -> (module, config class, run function, one-line help)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "inspect": ("eyas.target.inspect", "InspectConfig", "run", "describe a target from its config alone (no weights)"),
    "prepare": ("eyas.data.prepare", "PrepareConfig", "run", "conversations -> token ids, loss masks, packing, draft vocab"),
    "regenerate": ("eyas.regenerate", "RegenerateConfig", "run", "replace assistant turns with the target's own answers"),
    "extract": ("eyas.extract", "ExtractConfig", "run", "run the target and write the hidden-state store"),
    "train": ("eyas.train.loop", "TrainConfig", "run", "train an EAGLE-3 draft (offline from a store, or online)"),
    "eval": ("eyas.decode.evaluate", "EvalConfig", "run", "native speculative decoding: tau, losslessness, speedup"),
    "export": ("eyas.export.commands", "ExportConfig", "run_export", "write a draft for vLLM or SGLang"),
    "import": ("eyas.export.commands", "ImportConfig", "run_import", "import a published EAGLE-3 draft into a run dir"),
    "serve-check": ("eyas.engines.serve_check", "ServeCheckConfig", "run", "serve the export in a real engine, compare tau"),
    "doctor": ("eyas.doctor", "DoctorConfig", "run", "preflight every hand-over in seconds, before weights load"),
    "demo": ("eyas.demo", "DemoConfig", "run", "the end-to-end job on the default model and dataset"),
    "run": ("eyas.recipes.command", "RunConfig", "run", "run a recipe: a resumable, time-budgeted pipeline of stages"),
}
# Commands whose first argument, when not a flag, is this field: `eyas run best-draft` = `eyas run --recipe best-draft`
POSITIONAL = {"run": "recipe"}

# Shown under each command's --help: the common invocations, copy-pasteable.
EXAMPLES: dict[str, list[str]] = {
    "inspect": ["eyas inspect --target smollm2-135m", "eyas inspect --target ./my-hf-model --json"],
    "prepare": ["eyas prepare --target smollm2-135m --data sharegpt --out prepared --max-samples 2000",
                "eyas prepare --target ./my-hf-model --data chats.jsonl --out prepared --max-length 2048"],
    "regenerate": ["eyas regenerate --target smollm2-135m --data sharegpt --out regen.jsonl --max-samples 500",
                   "eyas regenerate --backend openai --base-url http://127.0.0.1:8000/v1 --target my-model "
                   "--data chats.jsonl --out regen.jsonl"],
    "extract": ["eyas extract --target smollm2-135m --data prepared --out store",
                "eyas extract --target ./my-hf-model --data prepared --out store --store-dtype fp8"],
    "train": ["eyas train --target smollm2-135m --store store --data prepared --out run --epochs 2",
              "eyas train --target smollm2-135m --data prepared --online --out run --steps 1000",
              "eyas train --config run/train_config.yaml --resume"],
    "eval": ["eyas eval --target smollm2-135m --draft run --per-category 1 --max-new-tokens 64",
             "eyas eval --target smollm2-135m --draft run --tree auto --json > eval.json"],
    "export": ["eyas export --draft run --format vllm --out export-vllm"],
    "import": ["eyas import --src ./published-eagle3 --out run"],
    "serve-check": ["eyas serve-check --draft export-vllm --engine vllm --python /path/to/vllm-venv/bin/python",
                    "eyas serve-check --draft export-sglang --engine sglang --tree total=60,depth=7,topk=10 --dtype bf16"],
    "doctor": ["eyas doctor --target smollm2-135m --data prepared --store store --draft export-vllm"],
    "demo": ["eyas demo", "eyas demo --out /tmp/demo --max-samples 40 --eval-max-new-tokens 32",
             "eyas demo --device cuda --max-samples 5000"],
    "run": ["eyas run", "eyas run best-draft --show",
            "eyas run best-draft --set target=./my-model device=cuda --budget 4h --out runs/my-draft",
            "eyas run scaling --set kinds=self,raw sizes=1e6,3e6 --budget 540s",
            "eyas run demo-gpu --out runs/demo", "eyas run my-recipe.yaml --set epochs=2 --fresh"],
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eyas", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train, evaluate and export EAGLE-3 drafts for any Hugging Face causal LM.",
        epilog="examples:\n  eyas demo                      # the whole flow on SmolLM2-135M, ~10 min on 2 cores\n"
               "  eyas run                       # the recipes: resumable, time-budgeted pipelines of stages\n"
               "  eyas inspect --target smollm2-135m\n  eyas train --help\n\n"
               "Every command takes --config FILE.yaml whose keys are its flag names.\n"
               "CPU threads: --threads N or $EYAS_NUM_THREADS (default: the CPUs this process may use).")
    p.add_argument("-V", "--version", action="version", version=f"eyas {__version__}")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: the CPUs available)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the eyas version")
    for name, (_, _, _, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return p


def _print_result(result: Any) -> int:
    if isinstance(result, int):
        return result
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


def _split_global(argv: list[str], top: argparse.ArgumentParser) -> tuple[int | None, list[str]]:
    """Global options come before the command: `eyas --threads 1 demo ...`."""
    threads = None
    while argv and argv[0].startswith("--threads"):
        flag = argv.pop(0)
        value = flag.split("=", 1)[1] if "=" in flag else (argv.pop(0) if argv else "")
        try:
            threads = int(value)
        except ValueError:
            top.error(f"--threads takes a whole number of threads, got {value!r}")
        if threads < 1:
            top.error(f"--threads must be at least 1, got {threads}")
    return threads, argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    threads, argv = _split_global(argv, top)
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] in ("-V", "--version", "version"):
        print(f"eyas {__version__}" if argv[0] != "version" else __version__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in POSITIONAL and rest and not rest[0].startswith("-"):
        rest = [f"--{POSITIONAL[cmd]}", rest[0], *rest[1:]]
    if cmd not in COMMANDS:
        import difflib

        near = difflib.get_close_matches(cmd, COMMANDS, n=1)
        top.error(f"unknown command {cmd!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                  + f" (commands: {', '.join(COMMANDS)})")
    from eyas.threads import configure_cpu

    configure_cpu(threads)   # before the stage module imports torch: the OpenMP policy is read at load
    from eyas.cli_help import config_class
    from eyas.config import ConfigError, add_config_args, build_config, check_flags

    module_name, cls_name, fn_name, help_ = COMMANDS[cmd]
    wants_help = any(a in ("-h", "--help") for a in rest)
    cls = config_class(module_name, cls_name, light=wants_help)
    parser = argparse.ArgumentParser(prog=f"eyas {cmd}", description=help_,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES.get(cmd, [])))
    add_config_args(parser, cls)
    if cmd in POSITIONAL:
        parser.usage = parser.usage.replace(f"eyas {cmd} ", f"eyas {cmd} [{POSITIONAL[cmd].upper()}] ", 1)
    args, unknown = parser.parse_known_args(rest)
    if unknown:
        parser.error(check_flags(unknown, cls))
    try:
        cfg = build_config(cls, args)
    except ConfigError as e:
        print(f"eyas {cmd}: {e}", file=sys.stderr)
        return 2
    import importlib

    module = importlib.import_module(module_name)
    try:
        return _print_result(getattr(module, fn_name)(cfg))
    except KeyboardInterrupt as e:  # Ctrl-C: what was done is kept; the message says how to continue
        print(f"eyas {cmd}: {str(e) or 'interrupted; finished work is kept: rerun the same command to continue'}",
              file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - sorted below: user-causable -> one line, bugs -> traceback
        line = explain(e, cmd)
        if line is None or env.get("EYAS_DEBUG"):
            raise
        print(f"eyas {cmd}: error: {line}", file=sys.stderr)
        return 1


# Commands whose finished work survives a failure and is continued by the same command run again.
RESUMABLE = {"regenerate", "extract", "train"}


def _disk_full(msg: str, cmd: str | None) -> str:
    return f"disk full ({msg}); free space and rerun " + (
        "(finished work is kept and resumed)" if cmd in RESUMABLE else "(nothing half-written was kept)")


def explain(e: BaseException, cmd: str | None = None) -> str | None:
    """One line for a failure the user can cause (bad input, missing or damaged file, full disk, ...);
    None for anything else, which is a bug and keeps its traceback. EYAS_DEBUG=1 shows every traceback."""
    from eyas.engines.base import EngineError

    msg = " ".join(str(e).split())  # one line, whatever the message
    if isinstance(e, (ValueError, EngineError)):  # ConfigError, StoreError, PreparedError, ContractError, ...
        return msg
    if isinstance(e, OSError):
        name = f"{e.filename}: " if getattr(e, "filename", None) and str(e.filename) not in msg else ""
        if e.errno == errno.ENOSPC:
            return name + _disk_full(msg, cmd)
        if isinstance(e, FileExistsError):
            return f"{name}{msg}; remove it or choose another --out"
        if isinstance(e, PermissionError):
            return f"{name}{msg}; check the path's permissions or choose another location"
        return f"{name}{msg}"
    if isinstance(e, KeyError):  # a key missing from a file the user gave; the message names it
        return f"missing key {msg}"
    if isinstance(e, ImportError):
        return f"{msg}; install the missing package (pip install {e.name or 'it'}) or pick another option"
    if type(e).__name__ == "SafetensorError":
        if "No space left" in msg or "os error 28" in msg:   # raised while writing one
            return _disk_full(msg, cmd)
        return f"a .safetensors file is damaged or not safetensors ({msg}); re-create it, or run `eyas doctor`"
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (
            isinstance(e, RuntimeError) and ("can't allocate memory" in msg or "out of memory" in msg.lower())):
        return f"out of memory ({msg[:200]}); lower --batch-size / --token-budget / --max-length"
    if type(e).__name__ == "UnpicklingError":
        return f"a file is not what it claims to be (unpickling refused: {msg[:200]}); re-create it"
    if isinstance(e, RecursionError):
        return f"input nested too deeply ({msg})"
    return None

if __name__ == "__main__":
    sys.exit(main())

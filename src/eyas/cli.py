"""The `eyas` command: parse, call one library function, print. `main(argv) -> int` is testable.

Every subcommand is a (module, Config class, run function) triple. A module is imported only when
its command runs, so `eyas --help` and `eyas doctor` start without importing torch's heavy paths.
The run function takes the validated config and returns an exit code (int) or a JSON-able summary.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from eyas import __version__
from eyas.config import ConfigError, add_config_args, build_config
from eyas.engines.base import EngineError

# name -> (module, config class, run function, one-line help)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "inspect": ("eyas.target.inspect", "InspectConfig", "run", "describe a target from its config alone (no weights)"),
    "prepare": ("eyas.data.prepare", "PrepareConfig", "run", "conversations -> token ids, loss masks, packing, draft vocab"),
    "regenerate": ("eyas.data.regenerate", "RegenerateConfig", "run", "replace assistant turns with the target's own answers"),
    "extract": ("eyas.store.extract", "ExtractConfig", "run", "run the target and write the hidden-state store"),
    "train": ("eyas.train.loop", "TrainConfig", "run", "train an EAGLE-3 draft (offline from a store, or online)"),
    "eval": ("eyas.decode.evaluate", "EvalConfig", "run", "native speculative decoding: tau, losslessness, speedup"),
    "export": ("eyas.export.commands", "ExportConfig", "run_export", "write a draft for vLLM or SGLang"),
    "import": ("eyas.export.commands", "ImportConfig", "run_import", "import a published EAGLE-3 draft into a run dir"),
    "serve-check": ("eyas.engines.serve_check", "ServeCheckConfig", "run", "serve the export in a real engine, compare tau"),
    "doctor": ("eyas.doctor", "DoctorConfig", "run", "preflight every hand-over in seconds, before weights load"),
    "demo": ("eyas.demo", "DemoConfig", "run", "the end-to-end job on the default model and dataset"),
}


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eyas", description=
                                "Train, evaluate and export EAGLE-3 drafts for any Hugging Face causal LM.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "version":
        print(__version__)
        return 0
    if cmd not in COMMANDS:
        top.error(f"unknown command {cmd!r}; choose from: version, {', '.join(COMMANDS)}")
    module_name, cls_name, fn_name, help_ = COMMANDS[cmd]
    module = importlib.import_module(module_name)
    cls = getattr(module, cls_name)
    parser = argparse.ArgumentParser(prog=f"eyas {cmd}", description=help_)
    add_config_args(parser, cls)
    args = parser.parse_args(rest)
    try:
        cfg = build_config(cls, args)
    except ConfigError as e:
        print(f"eyas {cmd}: {e}", file=sys.stderr)
        return 2
    try:
        return _print_result(getattr(module, fn_name)(cfg))
    except (ConfigError, FileNotFoundError, ValueError, EngineError) as e:
        # Expected user-facing failures: one clear line, no traceback.
        print(f"eyas {cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

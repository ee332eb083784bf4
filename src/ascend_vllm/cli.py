"""`ascend-vllm`: one command line for the plugin's tools.

Subcommands live in `ascend_vllm.commands`, one module each, exposing `HELP`, `add_arguments(parser)` and
`run(args) -> int`; they are discovered, so adding one touches no other file. Other installed packages add commands
through the `ascend_vllm.commands` entry-point group (the development-only testkit adds the demos this way, so a
runtime install carries no demo tooling).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from importlib.metadata import entry_points

from ascend_vllm import commands

ENTRY_POINT_GROUP = "ascend_vllm.commands"


def _command_modules() -> dict[str, object]:
    found = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            found[info.name.replace("_", "-")] = importlib.import_module(f"{commands.__name__}.{info.name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.load())
    return dict(sorted(found.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ascend-vllm",
        description="Tools for the Ascend NPU backend of vLLM (also runs on the CPU in the simulated-NPU lane).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _command_modules().items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

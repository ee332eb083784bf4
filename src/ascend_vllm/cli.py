"""`ascend-vllm`: one command line for the plugin's tools.

Subcommands live in `ascend_vllm.commands`, one module each, exposing `HELP`, `add_arguments(parser)` and
`run(args) -> int`; they are discovered, so adding one touches no other file. Other installed packages add commands
through the `ascend_vllm.commands` entry-point group (the development-only testkit adds the demos and
ascend-contracts the contract checker this way, so a runtime install carries no development tooling).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from importlib.metadata import entry_points

from ascend_vllm import commands

ENTRY_POINT_GROUP = "ascend_vllm.commands"
# Commands the development-only packages add: named with where they come from when typed where they are absent.
DEVELOPMENT_COMMANDS = {
    "contracts": "ascend-contracts",
    "demo": "ascend-testkit",
    "demo-pd": "ascend-testkit",
    "demo-pool": "ascend-testkit",
}


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


def _absent_development_command(argv: list[str]) -> str | None:
    typed = next((a for a in argv if not a.startswith("-")), None)
    if typed in DEVELOPMENT_COMMANDS and typed not in _command_modules():
        return (f"ascend-vllm: '{typed}' comes with the development-only {DEVELOPMENT_COMMANDS[typed]} package, which "
                "this installation does not have: run it from a checkout of the ascend-vllm repository after "
                "`uv sync` (see its README)")
    return None


def main(argv: list[str] | None = None) -> int:
    absent = _absent_development_command(sys.argv[1:] if argv is None else argv)
    if absent:
        print(absent, file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

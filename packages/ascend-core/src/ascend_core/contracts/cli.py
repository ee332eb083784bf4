"""`ascend-contracts` (also `ascend-vllm contracts`): check pins against a vLLM, scan our sources, fetch wheels.

    ascend-contracts check [--vllm PATH_OR_WHEEL_OR_VERSION] [--json]   exit 1 on an uncovered P0/P1
    ascend-contracts check --baseline OLD --vllm NEW                     what changes in pinned symbols, OLD -> NEW
    ascend-contracts scan [--root DIR] [--json] [--suggest]             exit 1 when a vLLM use has no pin
    ascend-contracts fetch VERSION                                       print the cached wheel's path
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ascend_core.contracts.checker import check
from ascend_core.contracts.drift import drift
from ascend_core.contracts.pin_drafts import draft_pins
from ascend_core.contracts.pins import PinsError, load_all_pins, load_pins
from ascend_core.contracts.report import render_table
from ascend_core.contracts.scan import ScanResult, check_folder, scan_workspace
from ascend_core.contracts.shapes import UpstreamView
from ascend_core.contracts.wheels import WheelFetchError, fetch_wheel

_RELEASE = re.compile(r"^(?:vllm==)?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)$")


def open_view(target: str | None) -> UpstreamView:
    """The installed vLLM (None or "installed"), a wheel or source folder (a path), or a release wheel (`0.33.0`,
    `vllm==0.33.0`, fetched into the wheel cache)."""
    if target is None or target == "installed":
        from ascend_core.contracts.installed_view import InstalledView

        return InstalledView()
    from ascend_core.contracts.source_reader import open_source
    from ascend_core.contracts.static_view import StaticView

    path = Path(target).expanduser()
    if not path.exists():
        match = _RELEASE.match(target)
        if not match:
            raise FileNotFoundError(f"--vllm {target!r}: no such file or folder, and not a release like '0.33.0'")
        path = fetch_wheel(match.group(1))
    return StaticView(open_source(path))


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", metavar="PATH_OR_WHEEL", default=None,
                        help="a vLLM source tree, a release .whl, a release version to fetch (0.33.0), or "
                             "'installed' (default: the installed vLLM, imported)")
    parser.add_argument("--baseline", metavar="PATH_OR_WHEEL", default=None,
                        help="report what changes in the pinned symbols from this vLLM to --vllm (main2main), "
                             "instead of checking --vllm against the pins")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--pins", metavar="FILE", action="append", default=None,
                        help="check this pins file only (repeatable; default: every installed ascend package's)")


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", metavar="DIR", default=None,
                        help="workspace root with packages/*/src (default: found from the current folder, else the "
                             "installed packages)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--suggest", action="store_true",
                        help="print [[pins]] entries for the unpinned symbols, read from the installed vLLM")


def run_check(args: argparse.Namespace) -> int:
    try:
        pins = [p for f in args.pins for p in load_pins(f)] if args.pins else load_all_pins()
        view = open_view(args.vllm)
        baseline = open_view(args.baseline) if getattr(args, "baseline", None) else None
    except (PinsError, FileNotFoundError, WheelFetchError, ValueError) as exc:
        print(f"ascend-contracts: {exc}", file=sys.stderr)
        return 2
    report = check(pins, view) if baseline is None else drift(pins, baseline, view)
    print(report.to_json() if args.json else render_table(report))
    return report.exit_code


def find_workspace(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if any(folder.glob("packages/*/src/*/upstream_pins.toml")):
            return folder
    return None


def scan(root: Path | None) -> ScanResult:
    """Scan the workspace at `root`, or each installed package of ours against its own pins when `root` is None."""
    if root is not None:
        return scan_workspace(root)
    from ascend_core.contracts.pins import discover_pins_files

    result = ScanResult()
    for name, pins_file in discover_pins_files().items():
        result.usages[name], result.unpinned[name] = check_folder(pins_file.parent, load_pins(pins_file, name))
    return result


def run_scan(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else find_workspace(Path.cwd())
    try:
        result = scan(root)
    except PinsError as exc:
        print(f"ascend-contracts: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "root": str(root) if root else None,
            "usages": {p: len(u) for p, u in result.usages.items()},
            "unpinned": {p: [{"symbol": u.symbol, "file": u.file, "line": u.line, "how": u.how} for u in us]
                         for p, us in result.unpinned.items() if us},
        }, indent=2))
    else:
        for package, usages in result.usages.items():
            missing = result.unpinned_symbols(package)
            print(f"{'ok ' if not missing else '-- '}{package}: {len({u.symbol for u in usages})} vLLM symbols used, "
                  f"{len(missing)} unpinned")
            for symbol in missing:
                first = next(u for u in result.unpinned[package] if u.symbol == symbol)
                print(f"      {symbol}  ({first.how}, {first.file}:{first.line})")
    if args.suggest and not result.ok:
        view = open_view(None)
        for package, usages in result.unpinned.items():
            if usages:
                print(f"\n# ---- draft pins for {package} (review before appending to its upstream_pins.toml)\n")
                print(draft_pins(usages, view))
    return 0 if result.ok else 1


def run_fetch(args: argparse.Namespace) -> int:
    try:
        print(fetch_wheel(args.version))
    except (WheelFetchError, ValueError) as exc:
        print(f"ascend-contracts: {exc}", file=sys.stderr)
        return 2
    return 0


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="contracts_command", metavar="ACTION")
    p = sub.add_parser("check", help="check every pin against a vLLM; exit 1 on an uncovered P0/P1 finding")
    add_check_arguments(p)
    p.set_defaults(_contracts_run=run_check)
    p = sub.add_parser("scan", help="find vLLM symbols our sources use that no pin covers; exit 1 if any")
    add_scan_arguments(p)
    p.set_defaults(_contracts_run=run_scan)
    p = sub.add_parser("fetch", help="download a vLLM release wheel into the cache (pip download --no-deps)")
    p.add_argument("version", help="a release such as 0.33.0")
    p.set_defaults(_contracts_run=run_fetch)


def dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    run = getattr(args, "_contracts_run", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascend-contracts", description=__doc__.splitlines()[0])
    add_subcommands(parser)
    return dispatch(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())

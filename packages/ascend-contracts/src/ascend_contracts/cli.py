"""`ascend-contracts` (also `ascend-vllm contracts`): check pins against a vLLM, scan our sources, fetch wheels.

    ascend-contracts check [--vllm PATH_OR_WHEEL_OR_VERSION] [--json]   exit 1 on an uncovered P0/P1
    ascend-contracts check --baseline OLD --vllm NEW                     what changes in pinned symbols, OLD -> NEW
    ascend-contracts scan [--root DIR] [--json] [--suggest]             exit 1 when a vLLM use has no pin
    ascend-contracts fetch VERSION                                       print the cached wheel's path
    ascend-contracts check --torch-npu VERSION_OR_WHEEL [--json]         our torch_npu pins and call sites against
                                                                         that release; exit 1 on a P0/P1
    ascend-contracts pin-torch-npu [--torch-npu VERSION] [--write]       regenerate the torch_npu pins files
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ascend_contracts.checker import check
from ascend_contracts.drift import drift
from ascend_contracts.pin_drafts import draft_pins
from ascend_contracts.pins import PinsError, load_all_pins, load_pins
from ascend_contracts.report import render_table
from ascend_contracts.scan import ScanResult, check_folder, scan_workspace
from ascend_contracts.shapes import UpstreamView
from ascend_contracts.wheels import WheelFetchError, fetch_wheel

_RELEASE = re.compile(r"^(?:vllm==)?(\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)$")


def open_view(target: str | None) -> UpstreamView:
    """The installed vLLM (None or "installed"), a wheel or source folder (a path), or a release wheel (`0.33.0`,
    `vllm==0.33.0`, fetched into the wheel cache)."""
    if target is None or target == "installed":
        from ascend_contracts.installed_view import InstalledView

        return InstalledView()
    from ascend_contracts.source_reader import open_source
    from ascend_contracts.static_view import StaticView

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
                        help="check this pins file only (repeatable; default: every installed ascend package's); "
                             "with --torch-npu, a torch_npu_pins.toml")
    parser.add_argument("--torch-npu", metavar="VERSION_OR_WHEEL", default=None,
                        help="check the torch_npu pins and every torch_npu call site against this torch_npu release "
                             "(2.14.0, fetched into the wheel cache) or wheel, instead of checking a vLLM")
    parser.add_argument("--root", metavar="DIR", default=None,
                        help="with --torch-npu: the workspace whose packages/*/src to scan (default: found from the "
                             "current folder, else the installed packages)")


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", metavar="DIR", default=None,
                        help="workspace root with packages/*/src (default: found from the current folder, else the "
                             "installed packages)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--suggest", action="store_true",
                        help="print [[pins]] entries for the unpinned symbols, read from the installed vLLM")


def run_check(args: argparse.Namespace) -> int:
    if getattr(args, "torch_npu", None) is not None:
        return run_torch_npu_check(args)
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
    from ascend_contracts.pins import discover_pins_files

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


def _torch_npu_sources(root: str | None):
    from ascend_contracts.torch_npu_check import Sources

    folder = Path(root) if root else find_workspace(Path.cwd())
    return Sources.of_workspace(folder) if folder is not None else Sources.installed()


def run_torch_npu_check(args: argparse.Namespace) -> int:
    from ascend_contracts.torch_npu_check import check_torch_npu
    from ascend_contracts.torch_npu_pins import load_op_pins
    from ascend_contracts.torch_npu_report import render_torch_npu_table
    from ascend_contracts.torch_npu_wheel import TorchNpuWheelError, open_torch_npu_wheel

    if args.vllm is not None or args.baseline is not None:
        print("ascend-contracts: --torch-npu checks torch_npu only; check --vllm/--baseline in a separate run",
              file=sys.stderr)
        return 2
    try:
        sources = _torch_npu_sources(args.root)
        # A pins file belongs to the package whose folder holds it, as the calls of that package are held to it.
        pins = {Path(f).parent.name: load_op_pins(f) for f in args.pins} if args.pins else sources.pins()
        wheel = open_torch_npu_wheel(args.torch_npu)
    except (PinsError, FileNotFoundError, WheelFetchError, TorchNpuWheelError, ValueError) as exc:
        print(f"ascend-contracts: {exc}", file=sys.stderr)
        return 2
    report = check_torch_npu(wheel, pins, sources.calls())
    print(report.to_json() if args.json else render_torch_npu_table(report))
    return report.exit_code


def run_pin_torch_npu(args: argparse.Namespace) -> int:
    from ascend_contracts.torch_npu_check import generate_pins
    from ascend_contracts.torch_npu_pins import DEFAULT_TORCH_NPU, TORCH_NPU_PINS_FILE, render_op_pins
    from ascend_contracts.torch_npu_wheel import TorchNpuWheelError, open_torch_npu_wheel

    try:
        sources = _torch_npu_sources(args.root)
        release = args.torch_npu or next((p.torch_npu for p in sources.pins().values()), DEFAULT_TORCH_NPU)
        wheel = open_torch_npu_wheel(release)
        rows = generate_pins(wheel, sources)
    except (PinsError, FileNotFoundError, WheelFetchError, TorchNpuWheelError, ValueError) as exc:
        print(f"ascend-contracts: {exc}", file=sys.stderr)
        return 2
    for package in sorted(rows):
        text = render_op_pins(package, wheel.version, rows[package])
        target = sources.folders[package] / TORCH_NPU_PINS_FILE
        if args.write:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target} ({len(rows[package])} ops, torch_npu {wheel.version})")
        else:
            print(f"# ---- {target}\n{text}")
    return 0


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
    p = sub.add_parser("pin-torch-npu", help="regenerate each package's torch_npu_pins.toml from its torch_npu call "
                                             "sites and a torch_npu wheel (printed unless --write)")
    p.add_argument("--torch-npu", metavar="VERSION_OR_WHEEL", default=None,
                   help="the release to read schemas from (default: the one the pins name, else 2.13.0)")
    p.add_argument("--root", metavar="DIR", default=None, help="the workspace (default: found from the current folder)")
    p.add_argument("--write", action="store_true", help="write the files instead of printing them")
    p.set_defaults(_contracts_run=run_pin_torch_npu)
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

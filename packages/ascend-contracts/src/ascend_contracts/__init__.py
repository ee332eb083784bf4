"""Upstream contract pins and the drift checker.

Each package lists the vLLM symbols it relies on in `upstream_pins.toml`; `check(pins, view)` grades how one vLLM
release (imported, or a source tree / wheel read with `ast`) differs from them, and says which adapter in
`ascend_core.upstream` covers each difference. `scan_workspace` finds vLLM uses in our sources that no pin covers.
"""

from ascend_contracts.checker import check, check_pin
from ascend_contracts.pins import Pin, PinsError, discover_pins_files, load_all_pins, load_pins
from ascend_contracts.report import Finding, Report, render_table
from ascend_contracts.scan import ScanResult, Usage, is_pinned, scan_source, scan_workspace
from ascend_contracts.shapes import Missing, Param, Shape, UpstreamView
from ascend_contracts.wheels import cache_dir, fetch_wheel

__all__ = [
    "Finding",
    "Missing",
    "Param",
    "Pin",
    "PinsError",
    "Report",
    "ScanResult",
    "Shape",
    "UpstreamView",
    "Usage",
    "cache_dir",
    "check",
    "check_pin",
    "discover_pins_files",
    "fetch_wheel",
    "is_pinned",
    "load_all_pins",
    "load_pins",
    "render_table",
    "scan_source",
    "scan_workspace",
]

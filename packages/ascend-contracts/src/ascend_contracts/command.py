"""`ascend-vllm contracts`: upstream contract pins against a vLLM (installed, source tree or wheel), and the scan.

    ascend-vllm contracts check [--vllm PATH_OR_WHEEL] [--json]
    ascend-vllm contracts scan [--root DIR] [--suggest]
    ascend-vllm contracts fetch 0.33.0
"""

from __future__ import annotations

import argparse

HELP = "Check the vLLM symbols our packages pin against a vLLM release, or find uses no pin covers."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ascend_contracts.cli import add_subcommands

    add_subcommands(parser)
    parser.set_defaults(_contracts_parser=parser)


def run(args: argparse.Namespace) -> int:
    from ascend_contracts.cli import dispatch

    return dispatch(args, args._contracts_parser)

"""`ascend-vllm options`: every option the Ascend platform reads from vLLM's `additional_config`."""

from __future__ import annotations

import argparse
import json
import textwrap

HELP = ("List the Ascend platform's options (vLLM's --additional-config / LLM(additional_config=...)): each key, its "
        "default and what it does. Unknown keys and bad values stop an engine's start-up naming the key.")
WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object: key -> {default, doc}")


def run(args: argparse.Namespace) -> int:
    from ascend_platform.plugin_config import ADDITIONAL_CONFIG_KEY, describe_options

    options = describe_options()
    if args.json:
        print(json.dumps({key: {"default": default, "doc": doc} for key, default, doc in options}))
        return 0
    print(f"Ascend options, given as --additional-config '{{\"KEY\": VALUE, ...}}' (or nested under "
          f"{ADDITIONAL_CONFIG_KEY!r}):\n")
    for key, default, doc in options:
        print(f"{key} (default {default})")
        print(textwrap.fill(doc, WIDTH, initial_indent="    ", subsequent_indent="    "))
    return 0

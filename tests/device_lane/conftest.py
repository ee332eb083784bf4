"""The device lane's engines: `AscendNPUPlatform` and `NPUWorker` inside real vLLM engines on the testkit's emulated
NPU runtime (`ascend_testkit.npu_runtime.process_env()`: `ASCEND_TESTKIT_NPU_RUNTIME=emulated` and its start-up hook,
`ASCEND_VLLM_SIMULATE` unset, cards of `CAPACITY` bytes), and the simulated lane's on the same models and prompts.

`lane_runs` starts four processes side by side (session-scoped: ~2-3 min for the lot on two cores), each running its
engines one after another (`device_engines.py`) and reporting, per engine, what it resolved to, its card's memory and
graph counters, its KV sizing (from vLLM's log) and what it generated:
* device: V1 at two memory utilizations (KV sizing), MRV2 with ACL graphs (compiled pieces) then asleep at levels 1
  and 2, MRV2 on the npu kernels eagerly and in ACL graphs;
* device TP=2: MRV2, then V1, with ACL graphs over two emulated cards and the emulated HCCL group, then
  DeepSeek-V2 MLA on MRV2 with ACL graphs;
* simulated: the same V1, MRV2 and MLA engines;
* `ascend-vllm serve` on the device lane (`lane_runs.serve`; its engine core in the server process, as the serving
  suites run theirs), answering while the others run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CAPACITY = 512 << 20
UTILIZATIONS = (0.25, 0.5)
RUN_TIMEOUT_S = 600
PROMPTS = [[5, 15], [127, 381], [129, 387]]  # token lengths before, on and after the 128-token block edge
MLA_PROMPTS = [[5, 15], [17, 51], [33, 99]]  # around the MLA engine's 16-token blocks
MAX_TOKENS = 8
CAPTURE_SIZES = [1, 2, 4]
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_KV_TOKENS = re.compile(r"NPU KV cache size: ([\d,]+) tokens")

LLAMA = dict(dtype="bfloat16", max_model_len=256, max_num_seqs=4, block_size=128, max_num_batched_tokens=64, seed=0)
# torch.compile'd pieces and ACL graphs for decode batches of 1, 2 and 4 requests. The reference kernels, as the
# simulated lane runs them: this tiny random bf16 model is ill-conditioned enough that two kernel sets' roundings
# part its greedy paths within a few tokens, so lanes are compared on the same kernels. The device's own kernels in
# graphs are compared with themselves eagerly (`v2_npu` against `v2_graphs_npu`).
GRAPHS = dict(enforce_eager=False, additional_config={"graph_capture_sizes": CAPTURE_SIZES,
                                                       "kernel_backend": "reference"})
NPU_GRAPHS = dict(enforce_eager=False, additional_config={"graph_capture_sizes": CAPTURE_SIZES})
MLA = dict(dtype="float32", max_model_len=256, max_num_seqs=4, block_size=16, max_num_batched_tokens=32,
           enable_chunked_prefill=True, gpu_memory_utilization=0.5, seed=0)


def _engine(name: str, model: Path, runner: str, engine: dict, prompts=PROMPTS, **more) -> dict:
    return {"name": name, "model": str(model), "runner": runner, "engine": engine, "prompts": prompts,
            "max_tokens": MAX_TOKENS, **more}


def plans(llama: Path, mla: Path) -> dict[str, list[dict]]:
    """The engines each process runs, in order (the KV-sizing engines first, on an empty card)."""
    eager = LLAMA | {"enforce_eager": True}
    graphs = LLAMA | GRAPHS | {"gpu_memory_utilization": 0.5}
    return {
        "device": [_engine("v1_low", llama, "v1", eager | {"gpu_memory_utilization": UTILIZATIONS[0]}),
                   _engine("v1", llama, "v1", eager | {"gpu_memory_utilization": UTILIZATIONS[1]}),
                   _engine("v2_graphs", llama, "v2", graphs | {"enable_sleep_mode": True}, sleep_levels=[1, 2]),
                   # The npu kernel backend (the device's default): eager, then its bindings traced into the pieces.
                   _engine("v2_npu", llama, "v2", eager | {"gpu_memory_utilization": 0.5}),
                   _engine("v2_graphs_npu", llama, "v2", LLAMA | NPU_GRAPHS | {"gpu_memory_utilization": 0.5})],
        "device_tp2": [_engine("tp2", llama, "v2", graphs | {"tensor_parallel_size": 2}),
                       _engine("tp2_v1", llama, "v1", graphs | {"tensor_parallel_size": 2}),
                       _engine("mla", mla, "v2", MLA | GRAPHS, prompts=MLA_PROMPTS)],
        # The same engines in the simulated lane (its graph policy records eager "graphs"; the tokens are the point).
        "simulated": [_engine("v1", llama, "v1", eager | {"gpu_memory_utilization": UTILIZATIONS[1]}),
                      _engine("v2_graphs", llama, "v2", graphs),
                      _engine("mla", mla, "v2", MLA | GRAPHS, prompts=MLA_PROMPTS)],
    }


def device_env(cache_root: Path) -> dict[str, str]:
    from ascend_testkit import npu_runtime
    from ascend_testkit.engine.env import vllm_cache_root
    from ascend_testkit.reach.collect import reach_env

    # tests/reach counts what these engines ran (the device-lane modules); its PYTHONPATH entry comes first, as the
    # emulated runtime's start-up hook is added to whatever PYTHONPATH the environment has.
    env = npu_runtime.process_env(dict(os.environ) | reach_env())
    env.pop("ASCEND_TESTKIT_TORCH_NPU", None)
    # The shared model-info cache spares vLLM's inspection subprocess (10-30 s per model class here).
    env.update({"ASCEND_TESTKIT_NPU_MEMORY": str(CAPACITY), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "VLLM_CACHE_ROOT": str(vllm_cache_root(cache_root / "vllm-device-lane"))})
    return env


def simulated_env(cache_root: Path) -> dict[str, str]:
    """The same engines in the simulated lane: what the device lane is compared with."""
    from ascend_testkit.reach.collect import reach_env

    env = device_env(cache_root)
    for key in ("ASCEND_TESTKIT_NPU_RUNTIME", "ASCEND_TESTKIT_NPU_MEMORY", "PYTHONPATH"):
        env.pop(key, None)
    env.update({k: v for k, v in (dict(os.environ) | reach_env()).items() if k == "PYTHONPATH"})
    env.update(ASCEND_VLLM_SIMULATE="1", VLLM_CPU_KVCACHE_SPACE="1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_run(name: str, out: str, err: str, returncode: int) -> dict[str, dict]:
    """{engine name: facts} of one process; each engine's KV sizing read from vLLM's log between its markers."""
    engines: dict[str, dict] = {}
    segments = re.split(r"^ENGINE (\S+)$", out, flags=re.MULTILINE)
    for engine, segment in zip(segments[1::2], segments[2::2], strict=True):
        lines = [line for line in segment.splitlines() if line.startswith(f"FACTS {engine} ")]
        if not lines:
            pytest.fail(f"{name}: engine {engine} printed no facts; rc {returncode}; stderr tail: {err[-3000:]}")
        facts = json.loads(lines[-1].removeprefix(f"FACTS {engine} "))
        memory, tokens = _KV_MEMORY.findall(segment), _KV_TOKENS.findall(segment)
        facts["kv_memory_gib"] = float(memory[-1]) if memory else None
        facts["kv_tokens"] = int(tokens[-1].replace(",", "")) if tokens else None
        facts["log_tail"] = (segment + err)[-3000:]
        engines[engine] = facts
    return engines


class LaneRuns:
    """`device[name]` / `simulated[name]`: an engine's facts (engine names are unique per lane); `serve`: the
    server's answers."""

    def __init__(self, runs: dict[str, dict[str, dict]], serve: dict) -> None:
        self.device = runs["device"] | runs["device_tp2"]
        self.simulated = runs["simulated"]
        self.serve = serve


def _serve(model: Path, cache_root: Path, log_dir: Path):
    from ascend_testkit.servers import start_serve, tiny_serve_args

    args = tiny_serve_args(max_model_len=256, max_num_seqs=4)
    args[args.index("--dtype") + 1] = "bfloat16"  # torch_npu's attention takes float16 / bfloat16
    env = device_env(cache_root) | {"VLLM_SERVER_DEV_MODE": "1"}  # its /collective_rpc tells what served
    return start_serve("device-serve", model, _free_port(), log_dir=log_dir, cpu=None, simulate=False,
                       env_extra=env, args=args)


def _ask(server) -> dict:
    import urllib.request

    from ascend_testkit.models.tiny_llama import prompt_of_length

    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    completion = post("/v1/completions", {"model": "tiny", "prompt": prompt_of_length(40, offset=1),
                                          "max_tokens": 16, "temperature": 0, "ignore_eos": True})
    usage = post("/collective_rpc", {"method": "ascend_usage"})
    return {"completion": completion, "usage": usage}


@pytest.fixture(scope="session")
def lane_runs(tiny_model, cache_root, tmp_path_factory) -> LaneRuns:
    import time

    from ascend_testkit.models.deepseek import cached_tiny_deepseek

    mla = cached_tiny_deepseek(cache_dir=cache_root / "models")
    logs = tmp_path_factory.mktemp("device-lane")
    script = Path(__file__).with_name("device_engines.py")
    env = {"device": device_env(cache_root), "device_tp2": device_env(cache_root),
           "simulated": simulated_env(cache_root)}
    # The emulated card's C++ half is built once here, before the processes below start together: on a fresh machine
    # a process whose start-up hook met another's build in progress came up without the card (the serve process in
    # CI: "asked for torch_npu before vLLM loaded the testkit's plugin").
    built = subprocess.run([sys.executable, "-c", "from ascend_testkit.npu_runtime import extension; extension.load()"],
                           env=env["device"], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"the emulated NPU device did not build: {built.stderr[-3000:]}"
    procs = {}
    for name, plan in plans(tiny_model, mla).items():  # output to files: a full pipe would stall an engine
        with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen([sys.executable, str(script), json.dumps(plan)], env=env[name], text=True,
                                           stdout=out, stderr=err)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    server = _serve(tiny_model, cache_root, logs)
    try:
        try:
            server.wait_healthy(timeout=RUN_TIMEOUT_S)
            serve = _ask(server)
        except Exception as exc:  # the serving test reports it; the engine runs go on
            serve = {"error": f"{type(exc).__name__}: {exc}"[:3000]}
        finally:
            server.close()
        runs = {}
        for name, proc in procs.items():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not finish within {RUN_TIMEOUT_S} s; logs in {logs}")
            runs[name] = parse_run(name, (logs / f"{name}.out").read_text(), (logs / f"{name}.err").read_text(),
                                   proc.returncode)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return LaneRuns(runs, serve)


@pytest.fixture(scope="session")
def device_capacity() -> int:
    return CAPACITY

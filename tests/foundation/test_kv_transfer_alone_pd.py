"""`pip install ascend-kv-transfer` alone serves disaggregated prefill between two plain vLLM CPU engines.

From the built wheels (`uv build --no-sources`: no workspace sources), a fresh virtual environment gets the locked
vLLM CPU build (scripts/test-package's shared base: exactly as locked, no ascend package) and the wheels of
ascend-kv-transfer and the members it declares, with what `ascend-kv-transfer[mooncake]` declares as locked
(Mooncake): no ascend-platform, ascend-specdecode, testkit or meta-package. Two engines of vLLM's own CPU
platform run there, in a loopback-only network namespace of this module, each in its own process
(kv_transfer_alone_engine.py): a kv_producer and a kv_consumer through `AscendMooncakeConnector`, which vLLM finds
through the wheel's own entry point. With `kv_load_failure_policy: fail` a decode whose KV did not arrive fails
instead of recomputing, so equal outputs mean the KV came over Mooncake.

Then the pool: two engines with `AscendStoreConnector` on one mooncake_master (in the same namespace) after the PD
pair made way; a prompt the first computed loads its full blocks from the pool in the second, with equal outputs.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
UV = shutil.which("uv")
if UV is None:  # a missing tool fails the run naming it, never a silent skip
    pytest.fail("uv is not on PATH: these tests build wheels and environments with it (pip install uv)", pytrace=False)
ALONE = ["ascend-kernels", "ascend-core", "ascend-kv-transfer"]  # the wheel and its declared members
BLOCK_SIZE = 128
LENGTHS = [BLOCK_SIZE - 1, BLOCK_SIZE + 1, 3 * BLOCK_SIZE + 5]
MAX_TOKENS = 8
PREFILL_PORT, DECODE_PORT = 31700, 31800  # side channels, inside this module's own namespace
MASTER_PORT = 27151  # below Linux's ephemeral range, where the engines in the namespace take theirs
SAVE_SETTLE_S = 3.0  # the pool's saver thread stores a finished prompt's blocks after its step
START_TIMEOUT_S = 480.0  # a cold engine start on a loaded 2-core machine (250 s seen with load 14)
REPLY_TIMEOUT_S = 120.0
MARK = "@@kv-alone@@ "

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}


def _run(args: list[str], **kw) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=_clean_env(), **kw)
    assert out.returncode == 0, f"{' '.join(args)}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _locked(tmp: Path, group: str) -> Path:
    path = tmp / f"{group}.txt"
    path.write_text(_run([UV, "export", "--frozen", "--no-emit-workspace", "--no-hashes", "--no-header",
                          "--no-annotate", "--only-group", group], cwd=ROOT))
    return path


@pytest.fixture(scope="module")
def alone_python(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("kv-alone")
    wheels = tmp / "wheels"
    for dist in ALONE:
        _run([UV, "build", "-q", "--package", dist, "--no-sources", "--wheel", "-o", str(wheels)], cwd=ROOT)
    # The locked vLLM CPU build comes from scripts/test-package's shared base (installed exactly as locked and
    # byte-compiled once, no ascend package in it), read through a .pth file: the same files a fresh install
    # would copy, without copying and compiling vLLM and torch again for this one environment.
    base_site = _run(["bash", "scripts/test-package", "--base"], cwd=ROOT).strip().splitlines()[-1]
    venv = tmp / "venv"
    _run([UV, "venv", "-q", "--python", "3.11", str(venv)])
    python = venv / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    Path(site, "_vllm_base.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    held = {line.split(";")[0].strip() for line in _locked(tmp, "vllm-current").read_text().splitlines()}
    # What ascend-kv-transfer[mooncake] declares, as locked, minus what the base holds at the same version.
    own = [line for line in _run([UV, "export", "--frozen", "--package", "ascend-kv-transfer", "--extra", "mooncake",
                                  "--no-dev", "--no-emit-workspace", "--no-hashes", "--no-header", "--no-annotate"],
                                 cwd=ROOT).splitlines() if line.split(";")[0].strip() not in held]
    (tmp / "own.txt").write_text("\n".join(own) + "\n")
    pip = [UV, "pip", "install", "-q", "--no-config", "--python", str(python), "--no-deps", "--find-links", str(wheels)]
    _run([*pip, "-r", str(tmp / "own.txt"), *(str(w) for w in sorted(wheels.glob("*.whl")))])
    return python


class Engine:
    """An engine process of the fresh environment; replies are read by a thread so every wait has a timeout."""

    def __init__(self, netns, python: Path, model: str, engine: dict, env: dict[str, str], log: Path):
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = netns.popen([str(python), str(HERE / "kv_transfer_alone_engine.py"),
                                 json.dumps({"model": model, "engine": engine})],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                cwd="/", text=True)
        self.log = log
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self._replies.put(json.loads(line[len(MARK):]))
        self._replies.put({"error": f"engine exited ({self.proc.wait()})"})

    def reply(self, timeout: float) -> dict:
        try:
            got = self._replies.get(timeout=timeout)
        except queue.Empty:
            got = {"error": f"no reply within {timeout} s"}
        if "error" in got:
            tail = self.log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"{got['error']}\n--- engine log tail ({self.log}):\n{tail}")
        return got

    def generate(self, requests: list[dict]) -> list[dict]:
        self.proc.stdin.write(json.dumps({"requests": requests}) + "\n")
        self.proc.stdin.flush()
        return self.reply(REPLY_TIMEOUT_S)["outputs"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"exit": true}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=10)  # a clean exit is quick; Mooncake threads may hold it up
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def _kv_config(role: str, port: int) -> dict:
    return {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"{role}-alone",
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": 30.0,
                                          "handshake_timeout_s": 5.0, "claim_wait_s": 10.0}}


@pytest.fixture(scope="module")
def alone_netns():
    from ascend_testkit.netns import LoopbackNamespace

    with LoopbackNamespace() as netns:
        yield netns


def _start_pair(netns, python: Path, model: str, tmp: Path, kv_configs: list[dict], env_extra: list[dict]):
    """Two engines started together, on one core each (or both on a test-all shard's core, ASCEND_TESTKIT_CPUS)."""
    shard_cpu = os.environ.get("ASCEND_TESTKIT_CPUS")
    started = []
    try:
        for cpu, (kv, extra) in enumerate(zip(kv_configs, env_extra, strict=True)):
            name = f"{kv['kv_role']}-{cpu}-{kv['kv_connector']}"
            env = _clean_env() | {
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": shard_cpu or str(cpu),
                "VLLM_CACHE_ROOT": str(tmp / f"vllm-cache-{name}"), "PYTHONDONTWRITEBYTECODE": "1"} | extra
            env.pop("ASCEND_VLLM_SIMULATE", None)
            engine = {"dtype": "float32", "enforce_eager": True, "seed": 0, "max_model_len": 1024,
                      "max_num_seqs": 4, "block_size": BLOCK_SIZE, "enable_prefix_caching": True,
                      "kv_transfer_config": kv}
            started.append(Engine(netns, python, model, engine, env, tmp / f"{name}.log"))
        readies = [e.reply(START_TIMEOUT_S) for e in started]
    except BaseException:
        for e in started:
            e.stop()
        raise
    return started, readies


@pytest.fixture(scope="module")
def engines(alone_python, alone_netns, model_dir, tmp_path_factory):
    pair = _start_pair(alone_netns, alone_python, model_dir, tmp_path_factory.mktemp("kv-alone-pd"),
                       [_kv_config("kv_producer", PREFILL_PORT), _kv_config("kv_consumer", DECODE_PORT)], [{}, {}])
    yield pair
    for e in pair[0]:
        e.stop()


@pytest.fixture(scope="module")
def pool_engines(engines, alone_python, alone_netns, model_dir, tmp_path_factory):
    """Two pool engines (kv_both, AscendStoreConnector) on one mooncake_master, after the PD pair made way; B
    hashes with another PYTHONHASHSEED than A (the pool's keys are content hashes)."""
    from ascend_testkit.mooncake_master import MooncakeMaster

    for e in engines[0]:
        e.stop()
    tmp = tmp_path_factory.mktemp("kv-alone-pool")
    master = MooncakeMaster(alone_netns, tmp / "master.log", rpc_port=MASTER_PORT)
    try:
        pool = {"kv_connector": "AscendStoreConnector", "kv_role": "kv_both",
                # the pool refuses "fail" (a looked-up block may be evicted before it is read)
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"master_server_address": master.address,
                                              "global_segment_size": "64MiB"}}
        pair = _start_pair(alone_netns, alone_python, model_dir, tmp, [pool, pool],
                           [{"PYTHONHASHSEED": "11"}, {"PYTHONHASHSEED": "22"}])
        yield pair
        for e in pair[0]:
            e.stop()
    finally:
        master.close()


def test_the_environment_holds_only_kv_transfer_and_what_it_declares(engines):
    _, readies = engines
    for ready in readies:
        assert ready["distributions"] == sorted(ALONE), ready


def test_decode_over_mooncake_equals_one_engine(engines, token_ids):
    (prefill, decode), _ = engines
    prompts = {f"len{n}": token_ids(n, offset=n) for n in LENGTHS}
    # One engine alone: the prefill engine serving whole requests (nothing handed off).
    expected = {o["id"]: o["token_ids"] for o in prefill.generate(
        [{"id": k, "prompt_token_ids": ids, "max_tokens": MAX_TOKENS} for k, ids in prompts.items()])}

    firsts = prefill.generate([{"id": f"p-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": f"x-{k}"}}
                               for k, ids in prompts.items()])
    for k, first in zip(prompts, firsts, strict=True):
        params = first["kv_transfer_params"]
        assert params and params["do_remote_prefill"] and params["transfer_id"] == f"x-{k}", (k, params)
        assert params["remote_bootstrap_addr"] == f"127.0.0.1:{PREFILL_PORT}", params

    outs = decode.generate([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS,
                             "kv_transfer_params": first["kv_transfer_params"]}
                            for (k, ids), first in zip(prompts.items(), firsts, strict=True)])
    got = {o["id"][2:]: o["token_ids"] for o in outs}
    assert got == expected
    assert all(len(v) == MAX_TOKENS for v in expected.values())


def test_a_prefix_one_engine_saved_to_the_pool_loads_in_another(pool_engines, token_ids):
    (a, b), readies = pool_engines
    assert all(r["distributions"] == sorted(ALONE) for r in readies), readies
    ids = token_ids(3 * BLOCK_SIZE + 20, offset=7)
    ref = a.generate([{"id": "a", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    assert ref["num_cached_tokens"] == 0  # computed from scratch: the one-engine reference
    time.sleep(SAVE_SETTLE_S)
    out = b.generate([{"id": "b", "prompt_token_ids": ids, "max_tokens": MAX_TOKENS}])[0]
    assert out["token_ids"] == ref["token_ids"]
    assert out["num_cached_tokens"] == 3 * BLOCK_SIZE  # B's full blocks came from the pool


if __name__ == "__main__":  # pragma: no cover - run by pytest
    sys.exit(pytest.main([__file__, "-q"]))

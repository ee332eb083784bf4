"""Session-wide fixtures of the cross-package tests: the tiny model, the shared engine hosts, the network namespace.

Every engine-level suite runs its engines on the hosts of ONE `HostPool` (`ascend_testkit.engine`): a host pays
vLLM's import once, then starts engines in seconds. A host's platform and model runner are its process's, as for a
user: "sim" (simulated-NPU lane, Model Runner V2: vLLM's default there), "sim-v1" (simulated lane, V1 runner) and
"cpu" (vLLM's own CPU platform, V1: the reference), plus the pinned hosts inside the loopback-only namespace that
connector tests ask for.

Reach: unless `ASCEND_TESTKIT_REACH` names a folder already, the session collects the engine processes' coverage in
a temporary one (`ascend_testkit.reach`); `tests/reach` checks it after every other test.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from ascend_testkit.reach.collect import REACH_ENV

REACH_TEST_DIR = Path(__file__).parent / "reach"
_OWN_REACH_DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(REACH_ENV):
        import tempfile

        os.environ[REACH_ENV] = tempfile.mkdtemp(prefix="ascend-reach-")
        config.stash[_OWN_REACH_DIR] = os.environ[REACH_ENV]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_REACH_DIR, None)
    if own:
        import shutil

        shutil.rmtree(own, ignore_errors=True)


# Test files with at least one passed test in this session: the reach check wants each file of tests/ to have one
# (a wholly skipped file proves nothing).
PASSED_FILES: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        PASSED_FILES.add(str(Path(report.fspath).resolve()))


@pytest.fixture(scope="session")
def passed_test_files() -> set[str]:
    return PASSED_FILES


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A session run beside the others on the same reach folder (scripts/test-all runs tests/foundation beside the
    # package suites) leaves the test files it passed tests of, so the reach check of the main session counts them.
    folder = os.environ.get(REACH_ENV)
    if folder and exitstatus == 0 and session.items and not _ran_the_reach_check(session):
        import json

        (Path(folder) / f"session-{os.getpid()}.tests.json").write_text(json.dumps(sorted(PASSED_FILES)))


# The engine host pool's account (hosts retired for memory and brought back), printed at the end of the session.
POOL_SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    for line in POOL_SUMMARY:
        terminalreporter.write_line(f"host pool: {line}")


def _ran_the_reach_check(session: pytest.Session) -> bool:
    return any(Path(str(item.path)).is_relative_to(REACH_TEST_DIR) for item in session.items)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # The reach check reads what the engine tests of this session recorded: it runs after all of them.
    items.sort(key=lambda item: Path(str(item.path)).is_relative_to(REACH_TEST_DIR))


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    root = os.environ.get("ASCEND_VLLM_CACHE")
    return Path(root) if root else tmp_path_factory.mktemp("ascend-cache")


@pytest.fixture(scope="session")
def tiny_model(cache_root) -> Path:
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    return cached_tiny_llama(cache_dir=cache_root / "models")  # the demo's --cache-dir is `cache_root`


@pytest.fixture(scope="session")
def model_dir(tiny_model) -> str:
    return str(tiny_model)


@pytest.fixture(scope="session")
def token_ids(model_dir):
    """`token_ids(n, offset)`: a prompt of exactly n token ids (distinct offsets give distinct prompts)."""
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    tok = AutoTokenizer.from_pretrained(model_dir)

    def make(n: int, offset: int = 0) -> list[int]:
        ids = tok(prompt_of_length(n, offset=offset))["input_ids"]
        assert len(ids) == n
        return ids

    return make


@pytest.fixture(scope="session")
def prompt_token_ids():
    """`prompt_token_ids(model, lengths, stride)`: {"len<n>": the ids of an n-token prompt} in the model's tokenizer."""
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    def make(model, lengths, stride: int) -> dict[str, list[int]]:
        tok = AutoTokenizer.from_pretrained(str(model))
        return {f"len{n}": tok(prompt_of_length(n, offset=stride * n))["input_ids"] for n in lengths}

    return make


@pytest.fixture(scope="session")
def host_pool(tmp_path_factory):
    from ascend_testkit.engine import HostPool

    pool = HostPool(tmp_path_factory.mktemp("engine-hosts"))
    yield pool
    POOL_SUMMARY.append(pool.summary())
    leftovers = pool.close()
    assert not leftovers, f"engine hosts still running: {leftovers}"


@pytest.fixture(scope="session")
def sim_host(host_pool):
    """The simulated-NPU lane as a user starts it (VLLM_USE_V2_MODEL_RUNNER unset): vLLM picks Model Runner V2 there,
    its default where Triton works (engines one after another).

    Skipped where the installed vLLM lacks what Ascend's MRV2 needs (the probe says what; the lane then serves with
    V1 and refuses an explicit MRV2 request, which tests/platform/test_release_lane.py checks)."""
    from ascend_core.upstream import mrv2_unavailable_reason

    refused = mrv2_unavailable_reason()
    if refused is not None:
        pytest.skip(f"Model Runner V2 is refused on this vLLM (probe mrv2_kv_hooks): {refused}")
    return host_pool.get("sim", lane="simulated", runner=None)


@pytest.fixture(scope="session")
def sim_v1_host(host_pool):
    """The simulated-NPU lane with the V1 model runner."""
    return host_pool.get("sim-v1", lane="simulated", runner="v1")


@pytest.fixture(scope="session")
def cpu_host(host_pool):
    """vLLM's own CPU platform (no plugin), V1 runner: the reference engines."""
    return host_pool.get("cpu", lane="cpu", runner="v1")


@pytest.fixture(scope="module")
def image_only_env(tmp_path_factory) -> dict[str, str]:
    """Environment that runs `allow_image_only_processor` first in every process (a `sitecustomize`): transformers'
    Qwen-VL modules without torchvision, which the vision-language models and vLLM's `qwen3_5.py` import need here."""
    from ascend_testkit.models.vision_language import image_only_env as env_in

    return env_in(tmp_path_factory.mktemp("image-only-site"))


@pytest.fixture(scope="module")
def image_only_host(host_pool, image_only_env):
    """`image_only_host(name, lane, runner, env=None)`: a module's engine hosts with `image_only_env` (plus `env`),
    closed when the module is done (vLLM processes the rest of the session does not need)."""
    names: set[str] = set()

    def get(name: str, lane: str, runner: str | None, env: dict[str, str] | None = None):
        names.add(name)
        return host_pool.get(name, lane=lane, runner=runner, env=image_only_env | (env or {}))

    yield get
    for name in names:
        host_pool.hosts[name].close()


@pytest.fixture(scope="session")
def netns():
    """A loopback-only network namespace (Mooncake listens on 0.0.0.0 whatever it is told)."""
    from ascend_testkit.netns import LoopbackNamespace, NetnsUnavailableError

    try:
        ns = LoopbackNamespace()
    except NetnsUnavailableError as e:
        pytest.fail(f"needs a loopback-only network namespace (run as root with util-linux and iproute2): {e}")
    yield ns
    ns.close()


@pytest.fixture(scope="session")
def netns_host(host_pool, netns):
    """`netns_host(lane, cpu, runner=None)`: the shared host of that lane and runner (default: vLLM's choice, V1 on
    its CPU platform, MRV2 in the simulated lane) inside the namespace, its engines' threads pinned to `cpu` (the
    connector suites share these: a warm host starts an engine in seconds)."""

    def get(lane: str, cpu: int, runner: str | None = None):
        from ascend_testkit.engine import default_runner

        runner = runner or default_runner(lane)
        return host_pool.get(f"{lane}-{runner}-cpu{cpu}-netns", lane=lane, runner=runner, netns=netns, cpus=cpu)

    return get


@pytest.fixture(scope="session")
def pd_pair(netns_host):
    """`with pd_pair(model, name, ports, runner=None, **engine) as (prefill, decode)`: a kv_producer engine on core 0
    and a kv_consumer engine on core 1 in the simulated lane (on `runner`, default the lane's), inside the loopback
    namespace, joined by AscendMooncakeConnector on the side-channel `ports` (prefill, decode); both started together,
    stopped on exit."""

    @contextlib.contextmanager
    def pair(model, name: str, ports: tuple[int, int], runner: str | None = None, **engine):
        hosts = []
        try:
            for cpu, (role, port) in enumerate(zip(("kv_producer", "kv_consumer"), ports, strict=True)):
                kv = {"kv_connector": "AscendMooncakeConnector", "kv_role": role, "engine_id": f"{name}-{role}",
                      "kv_load_failure_policy": "recompute",
                      "kv_connector_extra_config": {"side_channel_port": port, "abort_timeout_s": 30.0,
                                                    "handshake_timeout_s": 5.0, "claim_wait_s": 5.0}}
                host = netns_host("simulated", cpu, runner)
                host.start(str(model), wait=False, kv_transfer_config=kv, **engine)
                hosts.append(host)
            for host in hosts:
                host.started()
            yield tuple(hosts)
        finally:
            for host in hosts:
                if host.alive and host.engine is not None:
                    host.stop()

    return pair


@pytest.fixture(scope="session")
def disaggregate():
    """`disaggregate(prefill, decode, prompts, max_tokens, tag, sampling=None)` -> (the prefill engine's own outputs,
    the decode engine's outputs after a remote prefill, the decode engine's connector stats); `sampling`: extra
    sampling parameters of those two runs (e.g. logprobs). The prefill engine's prefix cache is reset between its own
    run and the remote prefills, so the prompts are computed again."""

    def run(prefill, decode, prompts: dict[str, list[int]], max_tokens: int, tag: str, sampling: dict | None = None):
        extra = {"sampling": sampling} if sampling else {}
        single = prefill.run_requests([{"id": f"single-{k}", "prompt_token_ids": ids, "max_tokens": max_tokens}
                                       | extra for k, ids in prompts.items()])
        prefill.call("reset_prefix_cache")
        firsts = prefill.run_requests([{"id": f"p-{k}", "prompt_token_ids": ids, "max_tokens": 1,
                                        "kv_transfer_params": {"do_remote_decode": True,
                                                               "transfer_id": f"{tag}-{k}"}}
                                       for k, ids in prompts.items()])
        outs = decode.run_requests([{"id": f"d-{k}", "prompt_token_ids": ids, "max_tokens": max_tokens,
                                     "kv_transfer_params": first["kv_transfer_params"]} | extra
                                    for (k, ids), first in zip(prompts.items(), firsts, strict=True)])
        return single, outs, decode.call("stats")

    return run

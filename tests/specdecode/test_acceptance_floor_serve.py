"""The acceptance-floor warning in a served engine: `ascend-vllm serve` with a bad (random) EAGLE draft warns that
acceptance collapsed, with no code of the user's.

vLLM's server front end (AsyncLLM) loads the ``vllm.stat_logger_plugins`` entry points; ascend-specdecode declares
`AcceptanceFloorPlugin` there, which sums the scheduler's spec-decode stats per engine and warns when the first draft
position's acceptance is under its floor (ASCEND_SPECDECODE_ACCEPTANCE_FLOOR) over a window of drafts
(ASCEND_SPECDECODE_ACCEPTANCE_WINDOW). A random draft is accepted far less often than the floor set here; the
completions still come back (the warning does not stop serving).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine

PORT = 8640
K = 3
FLOOR = 0.5  # tests/specdecode/test_speculative_engine.py holds a random draft's first position under it
WINDOW = 32
WARNING = "Speculative decoding acceptance below its floor on engine 0 at positions 0="


@pytest.fixture(scope="module")
def served_log(tmp_path_factory, netns, draft_models) -> str:
    from ascend_testkit.servers import inside, start_serve, tiny_serve_args

    spec = {"method": "eagle", "model": draft_models["eagle-random"], "num_speculative_tokens": K}
    env = {"ASCEND_SPECDECODE_ACCEPTANCE_FLOOR": str(FLOOR), "ASCEND_SPECDECODE_ACCEPTANCE_WINDOW": str(WINDOW)}
    server = start_serve(
        "floor",
        draft_models["target"],
        PORT,
        log_dir=tmp_path_factory.mktemp("serve-floor"),
        cpu=1,
        netns=netns,
        args=[*tiny_serve_args(max_model_len=256, max_num_seqs=4), "--speculative-config", json.dumps(spec)],
        env_extra=env,
    )
    try:
        server.wait_healthy()
        with inside(netns):
            client = server.openai_client()
            for offset in range(4):  # ~4 x 40 verification steps: several windows of drafts
                out = client.completions.create(
                    model="tiny", prompt=f"word{offset} " * 8, max_tokens=40, temperature=0,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                assert out.choices[0].text, out
        return server.log_path.read_text(errors="replace")
    finally:
        server.close()


def test_the_plugin_is_loaded_by_the_server(served_log):
    assert "ascend_acceptance_floor -> ascend_specdecode.metrics:AcceptanceFloorPlugin" in served_log


def test_collapsed_acceptance_is_warned(served_log):
    warnings = [line for line in served_log.splitlines() if WARNING in line]
    assert warnings, "no acceptance-floor warning in the server log"
    rate = float(warnings[0].split(WARNING, 1)[1].split(" ", 1)[0])
    assert rate < FLOOR, warnings[0]

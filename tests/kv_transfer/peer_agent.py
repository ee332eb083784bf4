"""A real producer agent (not a vLLM engine) that mirrors a prefill engine's metadata but changes one geometry field.

Usage: `peer_agent.py '<json>'` with {"fetch_from": [host, port], "agents": [{"port", "override", "transfer_id"}]}.
Prints one JSON line when serving; answers "stats" lines with a JSON line; exits when stdin closes.
"""

import json
import sys

import msgspec
import torch

from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.agent import MooncakeAgent
from ascend_kv_transfer.p2p.schema import MetadataRequest
from ascend_kv_transfer.p2p.side_channel import SideChannelClient


def main() -> None:
    config = json.loads(sys.argv[1])
    client = SideChannelClient(5.0)
    reference = client.request(tuple(config["fetch_from"]), MetadataRequest(requester="peer")).metadata
    client.close()
    agents, keep = [], []
    for spec in config["agents"]:
        geometry = msgspec.structs.replace(reference.geometry, **spec["override"])
        layers = {r.name: torch.zeros((16, r.page_bytes), dtype=torch.uint8) for r in reference.regions}
        keep.append(layers)
        agent = MooncakeAgent(engine_id=f"peer-{spec['port']}", geometry=geometry,
                              options=MooncakeOptions(side_channel_port=spec["port"]))
        agent.register(describe_kv_caches(layers))
        agent.serve(spec["port"])
        agent.holds.hold(spec["transfer_id"], f"req-{spec['transfer_id']}", [[0, 1, 2, 3]])
        agents.append(agent)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(json.dumps([a.stats.as_dict() | {"held_now": a.holds.num_held()} for a in agents]), flush=True)
    for agent in agents:
        agent.close()


if __name__ == "__main__":
    main()

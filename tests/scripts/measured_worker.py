"""One process of a 2-process `measured` profiling run over loopback (gloo collectives).

argv: process id, coordinator port, output JSON path. Each process gives JAX 2 CPU devices;
together they form a 1-D mesh of 4 and profile two configurations of a tiny GPT layer.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax

process, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=process,
    initialization_timeout=60,
)

import explorer as ex  # noqa: E402
from explorer.blocks import build_blocks  # noqa: E402
from explorer.mesh import mesh_spec  # noqa: E402
from explorer.platforms import load_platform  # noqa: E402
from explorer.profile.runner import profile_all  # noqa: E402
from explorer.segments import build_segments  # noqa: E402
from explorer.space import build_space  # noqa: E402

step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=1), abstract=True)
graph = ex.trace(step, *args)
spec = mesh_spec((4,))
analysis = build_space(build_blocks(graph, spec.size), spec)
segmentation = build_segments(graph, analysis)
profiles = profile_all(
    graph,
    analysis,
    segmentation,
    spec,
    platform=load_platform("cpu-local"),
    backend="measured",
    progress=False,
    workers=1,
    only=lambda kind, label, config: (
        kind == "segment" and label == "layer" and config in ("M@x,M@x,M@x,M@x", "N@x,K@x,N@x,K@x")
    ),
)
if process == 0:
    rows = [
        {"config": p.config, "t_comm": p.t_comm, "t_comp": p.t_comp, "status": p.status,
         "reason": p.reason}
        for p in profiles.segments
    ]  # fmt: skip
    with open(out, "w") as handle:
        json.dump(
            {"devices": jax.device_count(), "processes": jax.process_count(), "rows": rows}, handle
        )
jax.distributed.shutdown()

"""Devices of a GPU this machine does not have, to compile for (deviceless compilation).

XLA:GPU compiles for a GPU described by a target configuration (`GpuTargetConfigProto`)
without touching one; JAX exposes it through `jax.experimental.topologies`, whose devices
take part in meshes and shardings like real ones, for lowering and compiling only. It needs
JAX's CUDA plugin (`pip install 'explorer[gpu-target]'`), which loads without CUDA's
libraries when JAX runs on the CPU (`JAX_PLATFORMS=cpu`), or when its check of those
libraries is skipped (`JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import jax

from explorer.errors import TargetCompilerError

# The CUDA major version of the plugin the project installs (the `gpu-target` extra).
_PLUGIN = "jax_cuda13_plugin"
_INSTALL = f"pip install 'jax-cuda13-plugin=={jax.__version__}' (the explorer's gpu-target extra)"
# the versions written into a target where the plugin does not say what it was built with
_FALLBACK_VERSIONS = ((9, 12), (13, 0))


def plugin_versions() -> tuple[tuple[int, int], tuple[int, int]]:
    """(cuDNN, CUDA) (major, minor) versions the installed CUDA plugin was built against,
    which a target configuration names; an error saying how to install it where there is
    none."""
    try:
        importlib.import_module(_PLUGIN)
    except ImportError as err:
        raise TargetCompilerError(
            "compiling for a GPU without one needs JAX's CUDA plugin, which is not installed "
            f"here ({err}); install it with {_INSTALL}"
        ) from None
    try:
        versions = importlib.import_module(f"{_PLUGIN}._versions")
        cudnn = int(versions.cudnn_build_version())
        cuda = int(versions.cuda_runtime_build_version())
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return _FALLBACK_VERSIONS
    # cuDNN 91200 is 9.12.0; the CUDA runtime 13000 is 13.0
    return (cudnn // 10000, cudnn // 100 % 100), (cuda // 1000, cuda // 10 % 100)


@functools.lru_cache(maxsize=16)
def deviceless_gpus(config: str, nodes: int, per_node: int) -> tuple[Any, ...]:
    """`nodes * per_node` devices of the GPU `config` describes, `per_node` to a host."""
    from jax.experimental import topologies

    plugin_versions()  # a missing plugin is named as such, not as an unknown platform
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology=f"1x{nodes}x{per_node}"
        )
    except (NotImplementedError, RuntimeError) as err:
        raise TargetCompilerError(
            f"JAX could not load its CUDA plugin to compile for a GPU without one ({err}). "
            "On a machine without CUDA's libraries, start Python with JAX_PLATFORMS=cpu or "
            "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 set, so that JAX does not require them: "
            "compiling for a GPU needs none of them"
        ) from None
    return tuple(topology.devices)

"""Running the explorer on several processes joined with `jax.distributed`.

`join` a cluster (`ClusterSpec` from flags or a launcher's environment), then
`profile_on_cluster` measures every program on the global mesh with process 0 writing the
cache; `supervise` is the per-host parent the command line uses to turn lost hosts and
failed joins into clear errors.
"""

from explorer.cluster.join import (
    DEFAULT_TIMEOUT,
    EXIT_CLUSTER,
    Cluster,
    ClusterError,
    ClusterSpec,
    cluster_spec,
    join,
)
from explorer.cluster.profile import ClusterProfile, profile_on_cluster

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXIT_CLUSTER",
    "Cluster",
    "ClusterError",
    "ClusterProfile",
    "ClusterSpec",
    "cluster_spec",
    "join",
    "profile_on_cluster",
]

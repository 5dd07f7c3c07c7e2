"""Give JAX 8 virtual CPU devices before anything imports it.

The two LLVM flags make XLA's CPU code generation cheaper: the tests compile hundreds of small
sharded programs and never time them, so optimised machine code buys nothing here.
"""

import os

_FLAGS = (
    "--xla_force_host_platform_device_count=8",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
_existing = os.environ.get("XLA_FLAGS", "").split()
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in _existing if not f.startswith(tuple(x.split("=")[0] for x in _FLAGS))]
    + list(_FLAGS)
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Remove the session's shared profile cache (see helpers.SHARED_CACHE)."""
    from pathlib import Path

    from helpers import SHARED_CACHE

    for suffix in ("", "-wal", "-shm"):
        Path(f"{SHARED_CACHE}{suffix}").unlink(missing_ok=True)

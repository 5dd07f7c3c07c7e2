"""Give JAX 8 virtual CPU devices before anything imports it."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
    + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

"""Give JAX 8 virtual CPU devices before anything imports it; `make_read_only` for tests of
files that cannot be written.

The two LLVM flags make XLA's CPU code generation cheaper: the tests compile hundreds of small
sharded programs and never time them, so optimised machine code buys nothing here.
"""

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


def pytest_configure(config: pytest.Config) -> None:
    # A mesh that some blocks cannot split over warns (MeshFitWarning) and the run goes on.
    # Tests that pick such a mesh on purpose (the app's mesh-6 test) get it shown, not
    # raised by the suite's "error" filter; tests of the warning catch it with pytest.warns.
    config.addinivalue_line("filterwarnings", "always::explorer.errors.MeshFitWarning")


def pytest_sessionfinish(session: object, exitstatus: int) -> None:
    """Remove the session's shared profile cache (see helpers.SHARED_CACHE; written to the
    seed first when asked, see profile_seed) and the stores kept beside it: `analyze`'s
    frontiers, and the paper bench's evaluations, ILP answers and XLA:GPU memory figures."""
    from helpers import SHARED_CACHE
    from profile_seed import SEED, harvest, programs

    # what this run profiled beyond the seed: many programs means the seed is out of date
    print(f"\nshared profile cache: {programs(SHARED_CACHE)} programs, {programs(SEED)} seeded")
    written = harvest(SHARED_CACHE)
    if written is not None:
        print(f"profile seed written: {written} ({programs(written)} programs)")
    beside = (".frontiers.sqlite", ".evaluations.sqlite", ".alpa.sqlite", ".gpu-memory.sqlite")
    for store in (SHARED_CACHE, *(SHARED_CACHE.with_suffix(name) for name in beside)):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{store}{suffix}").unlink(missing_ok=True)


def _writable(path: Path) -> bool:
    probe = path / ".write-probe" if path.is_dir() else path
    try:
        with probe.open("a"):
            pass
    except OSError:
        return False
    if path.is_dir():
        probe.unlink()
    return True


@pytest.fixture
def make_read_only() -> Iterator[Callable[[Path], Path]]:
    """A function making a file or folder read-only for this process until the test ends:
    by its mode, and for root (whom modes do not stop) by the immutable attribute. The test
    is skipped where neither makes it so (it would test nothing)."""
    changed: list[tuple[Path, int, bool]] = []

    def make(path: Path) -> Path:
        mode = path.stat().st_mode
        os.chmod(path, mode & ~0o222)
        immutable = os.geteuid() == 0 and (
            subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode
            == 0
        )
        changed.append((path, mode, immutable))
        if _writable(path):
            pytest.skip(f"cannot make {path} read-only here (root without chattr +i?)")
        return path

    yield make
    for path, mode, immutable in reversed(changed):
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        os.chmod(path, mode)

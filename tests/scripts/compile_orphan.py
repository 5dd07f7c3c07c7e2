"""A process that sends a compile worker a long compile, then times it or dies during it.

argv: "time" or "die", how many unrolled layers the program has, and (for "die") the seconds
to wait once the worker runs before this process kills itself (SIGKILL: nothing of it runs
after, neither `close` nor the watchdog), or (for "time", optional) the seconds the compile
is given. Prints "seconds S", "still compiling after B seconds" or "worker PID".
"""

import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp

from explorer._jax_compat import compile_request
from explorer.profile.backends import FAST_COMPILE
from explorer.profile.compile_workers import CompileWorkers


def unrolled(x: jax.Array) -> jax.Array:
    for i in range(int(sys.argv[2])):
        x = jnp.tanh(x @ x) + i  # distinct ops: nothing folds them together
    return x


request = compile_request(
    jax.jit(unrolled).lower(jax.ShapeDtypeStruct((32, 32), jnp.float32)), FAST_COMPILE
)
assert request is not None
workers = CompileWorkers(processes=1, device_count=jax.device_count())
if sys.argv[1] == "time":
    # with a bound (argv[3], seconds) it only says whether the compile ended within it, and
    # stops the worker if not: timing the whole compile took minutes of CI
    bound = float(sys.argv[3]) if len(sys.argv) > 3 else None
    start = time.perf_counter()
    compiling = threading.Thread(target=workers.compile, args=(request,), daemon=True)
    compiling.start()
    compiling.join(bound)
    if compiling.is_alive():
        print(f"still compiling after {bound:.2f} seconds", flush=True)
        for pid in workers.pids():
            os.kill(pid, signal.SIGKILL)
        os._exit(0)  # not `close`: it would wait for the compile
    print(f"seconds {time.perf_counter() - start:.2f}", flush=True)
    workers.close()
else:
    threading.Thread(target=workers.compile, args=(request,), daemon=True).start()
    while not workers.pids():
        time.sleep(0.05)
    time.sleep(float(sys.argv[3]))
    print(f"worker {workers.pids()[0]}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

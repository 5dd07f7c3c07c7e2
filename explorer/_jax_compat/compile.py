"""Compiling a lowered program in another process, and reading what XLA made of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

# `jax.stages.Lowered` cannot cross a process boundary, and a compile-only profiler needs only
# what XLA makes of the module. A `CompileRequest` carries exactly what `Lowered.compile`
# hands XLA (the StableHLO module, the device assignment, the propagation flags, the compiler
# options), so the executable compiled from it elsewhere is the same program.


@dataclass(frozen=True, slots=True)
class CompileRequest:
    module: bytes  # StableHLO bytecode
    name: str
    tuple_args: bool
    allow_prop_to_inputs: tuple[bool, ...]
    allow_prop_to_outputs: tuple[bool, ...]
    device_ids: tuple[int, ...]
    platform: str
    options: tuple[tuple[str, Any], ...]
    # JAX settings that shape the compile options (`_compile_settings`), as in force here
    settings: tuple[tuple[str, Any], ...] = ()


# The JAX settings `compiler.get_compile_options` reads. JAX 0.11 dropped the two "effort"
# settings (the levels replace them), so each is read only where this JAX has it.
_COMPILE_SETTINGS = (
    "use_shardy_partitioner",
    "exec_time_optimization_effort",
    "memory_fitting_effort",
    "optimization_level",
    "memory_fitting_level",
    "enable_remat_opt_pass",
    "jax_xla_profile_version",
)


def _compile_settings() -> tuple[Any, ...]:
    """The JAX settings `compiler.get_compile_options` reads: a user may have changed them
    in this process with `jax.config.update`, which a fresh process would not see."""
    from jax._src import config

    return tuple(getattr(config, name) for name in _COMPILE_SETTINGS if hasattr(config, name))


@dataclass(frozen=True, slots=True)
class CompiledText:
    """What compile-only pricing reads from an executable, as plain data."""

    hlo: str  # the optimised HLO module, as text
    cost: dict[str, float] | None  # XLA's cost analysis; None where the backend has none
    # bytes per device: (arguments, outputs, temporaries, aliased); None where there is none
    memory: tuple[int, int, int, int] | None


def compile_request(lowered: Any, options: dict[str, Any]) -> CompileRequest | None:
    """The request that compiles `lowered` with `options` elsewhere; None for a program that
    cannot leave this process (host callbacks run Python of this process)."""
    from jax._src.interpreters import mlir, pxla

    lowering = lowered._lowering
    if not isinstance(lowering, pxla.MeshComputation):
        return None
    args = lowering.compile_args
    if args.get("host_callbacks") or lowering._device_list is None:
        return None
    to_inputs, to_outputs = pxla.get_prop_to_input_output(
        args["in_shardings"], args["out_shardings"], len(args["ordered_effects"])
    )
    devices = tuple(lowering._device_list)
    return CompileRequest(
        module=mlir.module_to_bytecode(lowering.stablehlo()),
        name=lowering._name,
        tuple_args=bool(args["tuple_args"]),
        allow_prop_to_inputs=tuple(to_inputs),
        allow_prop_to_outputs=tuple(to_outputs),
        device_ids=tuple(d.id for d in devices),
        platform=devices[0].platform,
        options=tuple(lowering._compiler_options_kvs) + tuple(options.items()),
        settings=tuple((holder.name, holder.value) for holder in _compile_settings()),
    )


def compile_from_request(request: CompileRequest) -> CompiledText:
    """Compile a request on this process's devices of its platform, as `Lowered.compile`
    would, and read the executable. The request's JAX settings are applied to this process
    (a worker's, made to compile requests)."""
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir, pxla
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    for name, value in request.settings:
        jax.config.update(name, value)
    backend = xla_bridge.get_backend(request.platform)
    by_id = {device.id: device for device in backend.devices()}
    missing = [i for i in request.device_ids if i not in by_id]
    if missing:
        raise ValueError(
            f"this process has no {request.platform} devices with ids {missing} "
            f"(it has {len(by_id)})"
        )
    devices = np.array([by_id[i] for i in request.device_ids], dtype=object)
    device_list = xla_client.DeviceList(tuple(devices))
    with mlir.make_ir_context():
        module = ir.Module.parse(request.module)
        options = pxla.create_compile_options(
            module,
            request.tuple_args,
            request.allow_prop_to_inputs,
            request.allow_prop_to_outputs,
            backend,
            devices,
            dict(request.options),
        )
        executable = compiler.compile_or_get_cached(
            backend, module, devices, options, (), device_list, None
        )
    return read_executable(executable)


def read_executable(executable: Any) -> CompiledText:
    """The optimised HLO, cost and memory analyses of an XLA executable or of a
    `jax.stages.Compiled`."""
    if hasattr(executable, "as_text"):  # jax.stages.Compiled
        hlo, cost, stats = (
            executable.as_text(),
            executable.cost_analysis(),
            executable.memory_analysis(),
        )
    else:
        hlo = executable.get_hlo_text()
        cost = executable.cost_analysis()
        stats = executable.get_compiled_memory_stats()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    memory = (
        None
        if stats is None
        else (
            int(stats.argument_size_in_bytes),
            int(stats.output_size_in_bytes),
            int(stats.temp_size_in_bytes),
            int(stats.alias_size_in_bytes),
        )
    )
    return CompiledText(
        hlo=hlo,
        cost=None if cost is None else {k: float(v) for k, v in cost.items()},
        memory=memory,
    )


def backends_started() -> bool:
    """Whether this process has started a JAX backend: XLA has then read `XLA_FLAGS`, and
    setting them changes nothing here."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())

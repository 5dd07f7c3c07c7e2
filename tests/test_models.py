"""Tests for the model zoo: tiny presets train, abstract args match, presets have the right size."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from explorer.errors import InputError
from explorer.models import (
    MODELS,
    BertConfig,
    FlaxDecoderConfig,
    GPTConfig,
    LlamaConfig,
    MoEConfig,
    bert,
    build,
    flax_decoder,
    gpt,
    llama,
    model_config,
    moe,
    presets,
)
from explorer.models._common import BaseConfig
from explorer.trace import trace

MODEL_NAMES = sorted(MODELS)
CONTROL_FLOW = {"scan", "while", "cond"}


@pytest.fixture(scope="module", params=MODEL_NAMES)
def trained(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Build a tiny model, jit its step once and train 20 steps on its fixed batch."""
    model = build(request.param, "tiny")
    step, args = model.step, model.args
    jitted = jax.jit(step)
    params, opt_state, batch, rng = args
    losses = []
    for i in range(20):
        loss, params, opt_state = jitted(params, opt_state, batch, jax.random.fold_in(rng, i))
        losses.append(float(loss))
    return {"name": request.param, "step": step, "args": args, "losses": losses}


def test_models_registry() -> None:
    expected = {
        "gpt": (gpt, GPTConfig),
        "llama": (llama, LlamaConfig),
        "moe": (moe, MoEConfig),
        "bert": (bert, BertConfig),
        "flax_decoder": (flax_decoder, FlaxDecoderConfig),
    }
    assert sorted(MODELS) == sorted(expected)
    for name, entry in expected.items():
        assert MODELS[name] == entry


def test_step_has_arg_roles(trained: dict[str, Any]) -> None:
    assert trained["step"].explorer_arg_roles == ("params", "opt_state", "data", "rng")


def test_example_args_are_concrete(trained: dict[str, Any]) -> None:
    params, opt_state, batch, rng = trained["args"]
    for leaf in jax.tree.leaves((params, opt_state, batch, rng)):
        assert isinstance(leaf, jax.Array)
    assert rng.shape == (2,) and rng.dtype == jnp.uint32
    assert all(v.dtype == jnp.int32 for v in batch.values())
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    if trained["name"] != "flax_decoder":  # Flax keeps its own parameter tree
        assert isinstance(params["layers"], tuple | list)


def test_loss_decreases(trained: dict[str, Any]) -> None:
    losses = trained["losses"]
    assert all(jnp.isfinite(jnp.asarray(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


def test_abstract_args_match_concrete(trained: dict[str, Any]) -> None:
    built = build(trained["name"], "tiny", abstract=True)
    step, abstract_args = built.step, built.args
    concrete = trained["args"]
    assert jax.tree.structure(abstract_args) == jax.tree.structure(concrete)
    for a, c in zip(jax.tree.leaves(abstract_args), jax.tree.leaves(concrete), strict=True):
        assert isinstance(a, jax.ShapeDtypeStruct)
        assert (a.shape, a.dtype) == (c.shape, c.dtype)
    loss, new_params, new_opt_state = jax.eval_shape(step, *abstract_args)
    assert loss.shape == () and loss.dtype == jnp.float32
    assert jax.tree.structure(new_params) == jax.tree.structure(abstract_args[0])
    assert jax.tree.structure(new_opt_state) == jax.tree.structure(abstract_args[1])


def _subjaxprs(value: Any) -> Iterator[Any]:
    if isinstance(value, jax.extend.core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax.extend.core.Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _subjaxprs(v)


def _primitive_names(jaxpr: Any) -> set[str]:
    names: set[str] = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in _subjaxprs(value):
                names |= _primitive_names(sub)
    return names


def test_no_control_flow(trained: dict[str, Any]) -> None:
    names = _primitive_names(jax.make_jaxpr(trained["step"])(*trained["args"]).jaxpr)
    assert "dot_general" in names
    assert not names & CONTROL_FLOW, names & CONTROL_FLOW


def test_named_scopes(trained: dict[str, Any]) -> None:
    text = jax.jit(trained["step"]).lower(*trained["args"]).as_text(debug_info=True)
    scopes = ("embed", "layer_0", "layer_1", "attn", "head")
    if trained["name"] == "flax_decoder":  # only the module names Flax puts in the name stack
        scopes = ("layer_0", "layer_1")
    for scope in scopes:
        assert scope in text, scope


def _count_primitive(jaxpr: Any, name: str) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == name
        for value in eqn.params.values():
            n += sum(_count_primitive(sub, name) for sub in _subjaxprs(value))
    return n


def test_gpt_layer_matmuls() -> None:
    """A GPT layer has exactly 4 weight matmuls plus the 2 attention einsums."""
    from explorer.models.gpt import loss_fn

    cfg = GPTConfig.tiny().replace(num_layers=1, dropout=0.0)
    _, (params, _, batch, rng) = gpt(cfg, abstract=True)
    jaxpr = jax.make_jaxpr(partial(loss_fn, cfg))(params, batch, rng).jaxpr
    # 4 layer matmuls + 2 attention einsums + the tied LM head.
    assert _count_primitive(jaxpr, "dot_general") == 7


NOMINAL: list[tuple[Callable[[], BaseConfig], float]] = [
    (GPTConfig.gpt_2_6b, 2.6e9),
    (GPTConfig.gpt_6_7b, 6.7e9),
    (LlamaConfig.llama_7b, 6.74e9),
    (MoEConfig.moe_7_1b, 7.1e9),
    (BertConfig.bert_large, 3.35e8),
]


@pytest.mark.parametrize(("preset", "nominal"), NOMINAL, ids=lambda v: getattr(v, "__name__", ""))
def test_paper_presets_size(preset: Callable[[], BaseConfig], nominal: float) -> None:
    n = preset().num_params()
    assert abs(n - nominal) / nominal < 0.10, (n, nominal)


def test_paper_preset_abstract_step() -> None:
    # Paper-scale args are shape-only (no weights allocated) and the step traces on them.
    step, args = moe(MoEConfig.moe_7_1b(), abstract=True)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(args))
    assert args[0]["layers"][1]["moe"]["w_in"].shape == (32, 1280, 10240)
    loss = jax.eval_shape(step, *args)[0]
    assert loss.shape == () and loss.dtype == jnp.float32


CONFIGS = [GPTConfig, LlamaConfig, MoEConfig, BertConfig, FlaxDecoderConfig]


@pytest.mark.parametrize("cls", CONFIGS)
def test_presets_are_listed_and_bf16_variants_change_only_the_dtype(cls: type[BaseConfig]) -> None:
    # PRESETS is what the CLI and the UI can offer: every preset classmethod is in it.
    defined = {n for n in dir(cls) if isinstance(inspect.getattr_static(cls, n), classmethod)}
    assert defined == set(cls.PRESETS)
    for name in cls.PRESETS:
        config = getattr(cls, name)()
        assert type(config) is cls
        if name.endswith("_bf16"):
            base = getattr(cls, name.removesuffix("_bf16"))()
            assert config == base.replace(dtype="bfloat16")
        else:
            assert config.dtype == "float32"


def _dot_operand_dtypes(jaxpr: Any) -> set[str]:
    found: set[str] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found |= {str(v.aval.dtype) for v in eqn.invars}
        for value in eqn.params.values():
            for sub in _subjaxprs(value):
                found |= _dot_operand_dtypes(sub)
    return found


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_bf16_preset_steps_in_bf16(name: str) -> None:
    model = build(name, "tiny_bf16")
    step, args = model.step, model.args
    params = args[0]
    assert {str(p.dtype) for p in jax.tree.leaves(params)} == {"bfloat16"}
    # every matmul multiplies bf16 by bf16; softmax, norms and the loss stay f32 inside
    assert _dot_operand_dtypes(jax.make_jaxpr(step)(*args).jaxpr) == {"bfloat16"}
    loss, new_params, new_opt_state = jax.jit(step)(*args)
    assert loss.dtype == jnp.float32 and bool(jnp.isfinite(loss))
    assert {str(p.dtype) for p in jax.tree.leaves(new_params)} == {"bfloat16"}
    # AdamW moments follow the parameters (the step count stays int32)
    assert {str(x.dtype) for x in jax.tree.leaves(new_opt_state)} == {"bfloat16", "int32"}
    if name == "gpt":  # and the explorer traces it into a graph
        assert trace(step, *args).ops


def test_paper_bf16_preset_halves_parameter_bytes() -> None:
    def nbytes(config: BaseConfig) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(config.abstract_params()))

    assert 2 * nbytes(BertConfig.bert_large_bf16()) == nbytes(BertConfig.bert_large())


@pytest.mark.parametrize("cls", CONFIGS)
def test_config_validation(cls: type[BaseConfig]) -> None:
    with pytest.raises(ValueError, match="hidden"):
        cls(hidden=60, heads=8)
    with pytest.raises(ValueError, match="num_layers"):
        cls(num_layers=0)
    with pytest.raises(ValueError, match="dtype"):
        cls(dtype="int32")
    assert cls.tiny() == cls()
    assert cls.small().num_params() > cls.tiny().num_params()


def test_moe_config_validation() -> None:
    with pytest.raises(ValueError, match="expert_group_size"):
        MoEConfig(expert_group_size=48)
    with pytest.raises(ValueError, match="num_experts"):
        MoEConfig(num_experts=1)
    assert MoEConfig.moe_7_1b().expert_capacity == 128


def test_moe_gating_respects_capacity() -> None:
    from explorer.models.moe import top2_gating

    logits = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 4))
    combine, dispatch, aux = jax.jit(partial(top2_gating, capacity=3))(logits)
    assert combine.shape == dispatch.shape == (2, 16, 4, 3)
    # Each expert slot holds at most one token; each token goes to at most two experts.
    assert float(jnp.max(jnp.sum(dispatch, axis=1))) <= 1.0
    assert float(jnp.max(jnp.sum(dispatch, axis=(2, 3)))) <= 2.0
    assert float(jnp.max(jnp.sum(combine, axis=(2, 3)))) <= 1.0 + 1e-6
    assert float(aux) > 0.0


# -- build: the zoo by name, inputs checked before anything is built ---------------------------


def test_build_applies_depth_batch_and_dtype_and_gives_shapes_when_abstract() -> None:
    model = build("llama", "tiny", layers=1, batch=4, dtype="bfloat16", abstract=True)
    assert model.config == LlamaConfig.tiny().replace(num_layers=1, batch=4, dtype="bfloat16")
    assert (model.name, model.preset) == ("llama", "tiny")
    params, _, data, _ = model.args
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(model.args))
    assert len(params["layers"]) == 1 and data["tokens"].shape[0] == 4
    assert {str(p.dtype) for p in jax.tree.leaves(params)} == {"bfloat16"}
    # the same step and arguments the model function gives for that config
    _, expected = llama(model.config, abstract=True)
    assert jax.tree.structure(expected) == jax.tree.structure(model.args)
    assert model.step.explorer_arg_roles == ("params", "opt_state", "data", "rng")


@pytest.mark.parametrize(
    ("name", "preset", "changes", "message"),
    [
        ("gtp", "tiny", {}, "expected one of gpt, llama, moe, bert, flax_decoder, found 'gtp'"),
        ("gpt", "huge", {}, "gpt has no preset 'huge'; expected one of tiny, tiny_bf16, small"),
        ("bert", "llama_7b", {}, "bert has no preset 'llama_7b'"),
        ("gpt", "tiny", {"layers": 0}, "layers: expected a positive int or None"),
        ("gpt", "tiny", {"layers": 2.0}, "layers: expected a positive int or None"),
        ("gpt", "tiny", {"batch": True}, "batch: expected a positive int or None"),
        ("gpt", "tiny", {"dtype": "int32"}, "expected a floating dtype, found 'int32'"),
        ("gpt", "tiny", {"remat": "yes"}, "remat: expected a bool or None"),
    ],
)
def test_build_refuses_bad_input_naming_the_valid_choices(
    name: str, preset: str, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        build(name, preset, **changes)


@pytest.mark.parametrize("name", ["gpt", "llama", "moe", "bert", "flax_decoder"])
def test_remat_recomputes_each_layer_and_changes_no_number(name: str) -> None:
    """`remat=True` checkpoints every layer: the backward pass runs each layer's forward ops
    again (ops JAX names `rematted_computation`), and the step computes what the plain step
    computes."""
    results = {}
    for remat in (False, True):
        model = build(name, "tiny", layers=2, remat=remat)
        jaxpr = jax.make_jaxpr(model.step)(*model.args).jaxpr
        # `jax.checkpoint`'s primitive (remat2 in JAX 0.10)
        checkpoints = [e for e in _all_eqns(jaxpr) if "remat" in e.primitive.name]
        assert len(checkpoints) == (2 if remat else 0), [e.primitive.name for e in jaxpr.eqns]
        results[remat] = jax.jit(model.step)(*model.args)
        assert model.config.remat is remat
    for plain, rematted in zip(
        jax.tree.leaves(results[False]), jax.tree.leaves(results[True]), strict=True
    ):
        assert jnp.allclose(plain, rematted, rtol=1e-5, atol=1e-6)


def _all_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of `jaxpr` and of the jaxprs in its equations' params."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(item, "jaxpr", item)  # a closed jaxpr holds one
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def test_every_listed_preset_of_every_model_builds_by_name() -> None:
    for name in MODELS:
        for preset in presets(name):
            assert type(model_config(name, preset)) is MODELS[name][1]

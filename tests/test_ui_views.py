"""The views' pure parts: ranked bars, the memory unit, the palette's second cue, titles."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly", reason="the ui extra is not installed")

from explorer.ui import style
from explorer.ui.bars import TOP, BarsData, BarsView
from explorer.ui.frontier import FrontierView, frontier_data


def _bars(n: int, chosen: dict[int, int]) -> BarsData:
    return BarsData(
        segment=1,
        label="layer",
        configs=tuple(f"c{i}" for i in range(n)),
        t_comp_ms=tuple(1.0 for _ in range(n)),
        t_comm_ms=tuple(0.01 * i for i in range(n)),
        memory=tuple(float(i) for i in range(n)),
        symbolic_ms=tuple(None for _ in range(n)),
        chosen=tuple(chosen.get(i, 0) for i in range(n)),
        collectives=tuple("no collectives" for _ in range(n)),
        note="",
        memory_bytes=tuple(i * 2**20 for i in range(n)),
    )


def test_many_configurations_show_the_fastest_and_always_the_plans_choice() -> None:
    view = BarsView()
    data = _bars(81, {60: 2})
    view.show(data)
    drawn = list(view.figure.data[0].x)
    assert drawn == [f"c{i}" for i in range(TOP)] + ["c60"]
    assert list(view.figure.data[0].marker.line.width) == [0.0] * TOP + [3.0]
    hover = view.figure.data[1].hovertext[-1]
    assert "rank 61 of 81" in hover and "communication 0.6 ms (38% of the time)" in hover
    assert "62,914,560 bytes" in hover  # exact bytes beside the unit
    title = view.figure.layout.title
    assert f"the {TOP} fastest of 81 configurations and the plan's" in title.text
    assert title.x == 0.0 and title.xanchor == "left"
    assert view.figure.layout.modebar.orientation == "v"  # never over the title
    assert view.figure.layout.autosize and view.figure.layout.width is None
    view.show(_bars(10, {}))  # few: all of them, no ranking words
    assert len(view.figure.data[0].x) == 10 and "fastest" not in view.figure.layout.title.text


def test_computation_is_drawn_on_its_own_scale_beside_far_larger_communication() -> None:
    """A layer whose communication is 1000x its computation: stacked on one axis the
    computation would be a pixel; in its own panel its tallest bar fills the panel."""
    import dataclasses

    data = dataclasses.replace(
        _bars(30, {25: 1}),
        t_comp_ms=tuple(0.01 + 0.001 * i for i in range(30)),
        t_comm_ms=tuple(10.0 + i for i in range(30)),
    )
    view = BarsView()
    view.show(data)
    comp, comm = view.figure.data[0], view.figure.data[1]
    layout = view.figure.layout
    assert comp.name == "computation" and comm.name == "communication"
    assert comp.yaxis == "y" and comm.yaxis == "y3"  # two axes, not one stack
    low, high = layout.yaxis.domain, layout.yaxis3.domain
    assert low[1] < high[0]  # the panels do not overlap
    shown = [data.t_comp_ms[int(c[1:])] for c in comp.x]
    assert list(comp.y) == shown and "c25" in comp.x  # the plan's choice is drawn
    assert layout.yaxis.range[0] == 0.0
    assert max(shown) / layout.yaxis.range[1] > 0.9  # the tallest fills its panel
    assert layout.yaxis3.range[1] >= max(comm.y) > 100 * layout.yaxis.range[1]
    hover = comp.hovertext[-1]
    assert "<b>c25</b>" in hover and "computation 0.035 ms (0.1% of the time)" in hover
    assert "communication 35 ms (100% of the time)" in hover and "total 35.03 ms" in hover


def test_one_memory_unit_per_analysis_with_exact_bytes_in_hover() -> None:
    assert style.memory_unit(900 * 2**20) is style.MIB
    assert style.memory_unit(3 * 2**30) is style.GIB
    assert style.GIB.text(3 * 2**30) == "3 GiB" and style.exact_bytes(1234567) == "1,234,567 bytes"
    view = FrontierView()
    view.show(frontier_data(None, (2 * 2**30, 0.001), 3 * 2**30, unit=style.GIB))
    assert view.data.current == (2.0, 1.0) and view.data.budget == 3.0
    assert view.figure.layout.xaxis.title.text == "memory per device (GiB)"


def test_block_classes_past_the_palette_get_a_second_cue() -> None:
    size = len(style.BLOCK_COLOURS)
    cues = [style.block_cue(i) for i in range(3 * size)]
    assert cues[:size] == [""] * size and cues[size : 2 * size] == ["-dot"] * size
    looks = {(style.block_colour(i), cues[i]) for i in range(2 * size)}
    assert len(looks) == 2 * size  # colour and cue tell 32 classes apart
    assert style.plan_name("cfp") == "this plan (CFP search)" and style.plan_name("x") == "x"


def test_the_op_layout_orders_each_layer_by_its_producers() -> None:
    """Layers by depth; within a layer the barycentre order makes edges shorter (in rows
    crossed) than the program's order does, on every segment of tiny GPT."""
    import explorer as ex
    from explorer.ui.layout import build_op_layout

    step, args = ex.models.gpt(ex.models.GPTConfig.tiny())
    analysis = ex.analyze(step, *args, mesh=(4,), profile=False)
    graph = analysis.graph
    for instance in analysis.segments.instances:
        layout = build_op_layout(analysis, instance.index)
        base = min(graph.ops[o].depth for o in layout.ops)
        assert layout.x == tuple(float(graph.ops[o].depth - base) for o in layout.ops)
        assert len(set(zip(layout.x, layout.y, strict=True))) == len(layout.ops)
        # the program's order within each layer, centred as the layout centres its rows
        rank: dict[float, list[int]] = {}
        for k, x in enumerate(layout.x):
            rank.setdefault(x, []).append(k)
        naive = [0.0] * len(layout.ops)
        for members in rank.values():
            for r, k in enumerate(members):
                naive[k] = r - (len(members) - 1) / 2

        if len(layout.ops) > 20:
            ours = sum(abs(layout.y[a] - layout.y[b]) for a, b in layout.edges)
            program = sum(abs(naive[a] - naive[b]) for a, b in layout.edges)
            print(f"{instance.label}: edges cross {ours:.0f} rows, {program:.0f} in program order")
            assert ours < program, instance.label


def test_an_approximate_frontier_says_how_far_from_exact_it_may_be() -> None:
    from explorer.solve import Frontier, FrontierPoint

    points = (FrontierPoint(2.0, 2**30, (0,)), FrontierPoint(1.0, 2 * 2**30, (1,)))
    view = FrontierView()
    view.show(frontier_data(Frontier(points), None, None, note="pinned", unit=style.GIB))
    assert view.figure.layout.title.text == "2 Pareto-optimal plans (pinned)"
    coarse = Frontier(points, memory_slack=3 * 2**29)
    view.show(frontier_data(coarse, None, None, note="pinned", unit=style.GIB))
    assert view.figure.layout.title.text == (
        "2 Pareto-optimal plans (approximate: every plan of the exact frontier has one here "
        "no slower within 1.5 GiB more memory; pinned)"
    )

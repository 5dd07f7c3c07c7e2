"""What each ParallelBlock does in its layer, read from the graph's structure (never a name).

A user reads "layer · mlp in" faster than "layer #2 layer_0/mlp". The names come from where
a block's operands come from and what its ops compute, so they hold for any model written in
any library; a block no rule recognises is named by its position ("block 3"). Names are
unique within a segment: a second block of one role is numbered ("experts in 2").

The rules, and why each holds for the layers it names:

- A *weight* operand is one whose inputs, followed back through ops outside every block, are
  parameters only (no data, no other block): a projection multiplies activations by it.
- `qkv`: a weight contraction whose block also holds an activation-by-activation contraction
  and an `exp`. The attention core (scores q·k, softmax, weights·v) splits along batch and
  heads without communication, so Algorithm 1 groups it with the projection that feeds it.
- `attention out`: a weight contraction reading the result of a `qkv` block (the heads are
  merged back into the model width).
- `mlp in`: a weight contraction that widens (N > K) and whose block applies an elementwise
  non-linearity (tanh, logistic, erf, max: GELU, SiLU, ReLU and their gated forms).
- `mlp out`: a weight contraction reading an `mlp in` block that narrows back (K > N).
- `router`: a weight contraction whose result reaches an `argmax`, `top_k` or `sort` before
  any other block: it scores experts per token, and the choice is a top-k of the scores.
- `experts in` / `experts out`: as `mlp in` / `mlp out` for a weight with the contraction's
  batch dim (E): one weight per expert, applied by a batched matmul.
- `dispatch` / `combine`: an activation-by-activation contraction reading the router (the
  one-hot routing mask): `dispatch` feeds an experts block, `combine` reads one.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

from explorer.ir import DimRole, Graph, ParallelBlock, Role, ValueKind

if TYPE_CHECKING:
    from explorer.pipeline import SegmentedStep

NONLINEAR = frozenset({"tanh", "logistic", "erf", "max", "gelu", "relu", "silu"})
SELECTS = frozenset({"argmax", "top_k", "sort", "approx_top_k"})
# Values visited before a search gives up: a weight is a few ops from its parameter (a cast,
# a transpose); the ops between two blocks (a norm, a router's softmax, top-k and capacity
# bookkeeping) number in the hundreds at most.
REACH = 64
BETWEEN_BLOCKS = 2048


class _Flow:
    """Which blocks and step inputs a value comes from, through ops outside every block."""

    def __init__(self, graph: Graph, owner: tuple[int | None, ...]) -> None:
        self.graph = graph
        self.owner = owner

    def sources(self, vid: int, block: int) -> set[int]:
        """The nearest blocks (other than `block`) that `vid` is computed from."""
        blocks: set[int] = set()
        queue, seen = deque([vid]), {vid}
        while queue and len(seen) < BETWEEN_BLOCKS:
            value = self.graph.values[queue.popleft()]
            if value.producer is None:
                continue
            who = self.owner[value.producer]
            if who is not None and who != block:
                blocks.add(who)
                continue
            for nxt in self.graph.ops[value.producer].inputs:
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        return blocks

    def is_weight(self, vid: int, block: int) -> bool:
        """Parameters only, all the way back (a cut-off search is not proof: not a weight)."""
        queue, seen = deque([vid]), {vid}
        while queue:
            if len(seen) > REACH:
                return False
            value = self.graph.values[queue.popleft()]
            if value.producer is None:
                if value.kind is not ValueKind.PARAMETER:
                    return False
                continue
            who = self.owner[value.producer]
            if who is not None and who != block:
                return False
            for nxt in self.graph.ops[value.producer].inputs:
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        return True

    def downstream(self, block: ParallelBlock) -> tuple[set[int], set[str]]:
        """Blocks that read `block`'s forward results, and the primitives on the way there."""
        graph = self.graph
        reached: set[int] = set()
        primitives: set[str] = set()
        start = [v for o in block.forward_ops for v in graph.ops[o].outputs]
        queue, seen = deque(start), set(start)
        while queue and len(seen) < BETWEEN_BLOCKS:
            for user in graph.users(queue.popleft()):
                op = graph.ops[user]
                if op.role is not Role.FORWARD:
                    continue
                who = self.owner[user]
                if who is not None and who != block.index:
                    reached.add(who)
                    continue
                if who is None:
                    primitives.add(op.primitive)
                for out in op.outputs:
                    if out not in seen:
                        seen.add(out)
                        queue.append(out)
        return reached, primitives


def block_roles(analysis: SegmentedStep) -> tuple[str, ...]:
    """Per block, its role by the rules of the module doc ("" where none applies)."""
    graph = analysis.graph
    owner = analysis.block_analysis.block_of_op
    flow = _Flow(graph, owner)
    facts = []
    for block in analysis.blocks:
        head = graph.ops[block.head]
        weight, activation_sources = False, set()
        for vid in head.inputs:
            if flow.is_weight(vid, block.index):
                weight = True
            else:
                activation_sources |= flow.sources(vid, block.index)
        members = [graph.ops[o] for o in block.forward_ops if o != block.head]
        primitives = {op.primitive for op in members}
        # an activation-by-activation contraction inside the block: attention's q.k or p.v
        core = any(
            op.primitive == "dot_general"
            and not any(flow.is_weight(v, block.index) for v in op.inputs)
            for op in members
        )
        sizes = dict(block.role_sizes)
        facts.append((weight, activation_sources, primitives, core, sizes))
    reached = [flow.downstream(b) for b in analysis.blocks]

    roles = [""] * len(analysis.blocks)
    # pass 1: what a block is by itself
    for b, (weight, _, primitives, core, sizes) in enumerate(facts):
        widens = sizes.get(DimRole.N, 0) > sizes.get(DimRole.K, 0)
        batched = DimRole.E in sizes
        if weight and core and "exp" in primitives:
            roles[b] = "qkv"
        elif weight and reached[b][1] & SELECTS:
            roles[b] = "router"
        elif weight and widens and primitives & NONLINEAR:
            roles[b] = "experts in" if batched else "mlp in"
    # pass 2: what a block is by what it reads
    for b, (weight, sources, _, _, sizes) in enumerate(facts):
        if roles[b]:
            continue
        narrows = sizes.get(DimRole.K, 0) > sizes.get(DimRole.N, 0)
        read = {roles[s] for s in sources}
        if weight and "qkv" in read:
            roles[b] = "attention out"
        elif weight and narrows and read & {"mlp in", "experts in"}:
            roles[b] = "experts out" if "experts in" in read else "mlp out"
    for b, (weight, sources, _, _, _) in enumerate(facts):
        if roles[b] or weight or "router" not in {roles[s] for s in sources}:
            continue
        if {roles[s] for s in sources} & {"experts out", "experts in"}:
            roles[b] = "combine"
        elif {roles[r] for r in reached[b][0]} & {"experts in", "experts out"}:
            roles[b] = "dispatch"
    return tuple(roles)


def block_names(analysis: SegmentedStep) -> tuple[str, ...]:
    """Per block, a name unique within its segment instance: its role (numbered when the
    instance has two of one role) or, where no rule applies, "block <position>"."""
    roles = block_roles(analysis)
    names = [""] * len(roles)
    for instance in analysis.segments.instances:
        counts = Counter(roles[b] for b in instance.blocks if roles[b])
        seen: Counter[str] = Counter()
        for position, b in enumerate(instance.blocks):
            role = roles[b]
            if not role:
                names[b] = f"block {position}"
            elif counts[role] > 1:
                seen[role] += 1
                names[b] = f"{role} {seen[role]}"
            else:
                names[b] = role
    for b, name in enumerate(names):  # blocks outside every instance (none today)
        names[b] = name or f"block {b}"
    return tuple(names)

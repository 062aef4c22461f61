"""Collectives as values (``tensoropt.traffic``): the cost model's communication time is the
price of the very list ``comms.predicted_collectives`` gives for a plan, and the list the apply
layer issues follows from the same rules."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

import tensoropt
from tensoropt.capture import capture
from tensoropt.comms import issued_collectives, predicted_collectives, summarize
from tensoropt.costmodel import CostModel
from tensoropt.execution import apply_mode, gradient_group, latency_shares, model_parallel
from tensoropt.hardware import get_link
from tensoropt.mesh import Mesh, parse_devices
from tensoropt.models import example_inputs, get_model
from tensoropt.placement import REPLICATE, Shard
from tensoropt.strategy import OpConfig
from tensoropt.training import TrainingConfig
from tensoropt.traffic import Collective, is_gradient_reduction, is_parameter_collective, operator_collectives, relayout_collectives, tied_copy, tied_uses


def _graph(name):
    return capture(get_model(name), tuple(example_inputs(name)), name=name)


@functools.cache
def _searched(model, devices):
    """A frontier without pipelines on meshes of up to two axes, and the graph it was searched on."""
    return tensoropt.frontier(model, devices, pipeline=False, progress=False, max_mesh_dims=2), _graph(model)


def _mesh(plan) -> Mesh:
    return Mesh(tuple(plan.mesh_shape), plan.mesh_axis_names, tuple(get_link(n) for n in plan.mesh_links))


@pytest.mark.parametrize("model, devices", [("gpt-tiny", "cpu:4"), ("gpt-tiny", "8xA100-80GB"),
                                            ("mlp-tiny", "cpu:2"), ("bert-tiny", "cpu:4"), ("cnn-tiny", "cpu:4")])
def test_priced_collectives_are_the_plans_communication_time(model, devices):
    f, graph = _searched(model, devices)
    device = parse_devices(devices).device
    plans = list(f.plans) + list(f.reference.values())
    tied = 0.0
    for p in plans:
        cm = CostModel(device, training=TrainingConfig.of_plan(p.training))
        colls = predicted_collectives(p, graph)
        want = p.breakdown["comm_s"] + p.breakdown["relayout_s"]
        assert cm.price(colls, _mesh(p)) == pytest.approx(want, rel=1e-12, abs=1e-18), p.summary
        tied += cm.price([c for c in colls if c.where.startswith(("tied", "grad of tied"))], _mesh(p))
    if tied_uses(graph) and model == "gpt-tiny":
        assert tied > 0, "the tied lm_head's moves are priced on some plan"


def test_issued_collectives_share_moves_and_report_the_loss():
    """On a data-parallel plan every operator splits the batch: no edge moves anything, the
    gradients are reduced one call per FSDP2 group, and the apply layer adds the reported
    loss value."""
    f = tensoropt.frontier("gpt-tiny", "cpu:2", pipeline=False, progress=False)
    graph = _graph("gpt-tiny")
    dp = f.reference["data parallel"]
    priced = summarize(predicted_collectives(dp, graph))
    issued = issued_collectives(dp, graph, "replicate")
    groups = {gradient_group(graph, op) for op in graph.operators if any(op.param_names)}
    assert summarize([c for c in issued if c.priced])["all_reduce"]["count"] == len(groups) == 3
    assert [c.where for c in issued if not c.priced] == ["reported loss value"]
    # FSDP2 sums the tied embedding's two uses before one reduction: the cost model prices the
    # later use's reduction too
    assert summarize([c for c in issued if c.priced])["all_reduce"]["bytes"] < priced["all_reduce"]["bytes"]


# By ``Collective.where``: what the apply layer issues unpriced, and what of the priced list it
# does not issue (a move that consumers of one tensor share; a tied parameter's later use,
# priced as from a replicated copy: its moves and its gradient's reduction).
APPLY_ONLY = ("tied parameter ", "reported loss value")
PRICED_NOT_ISSUED = ("edge ", "tied parameter ", "grad of tied parameter ")


@pytest.mark.parametrize("model, devices", [("gpt-tiny", "cpu:4"), ("bert-tiny", "cpu:4")])
def test_issued_collectives_are_priced_ones_and_the_apply_only_extras(model, devices):
    f, graph = _searched(model, devices)
    extras = Counter()
    for p in list(f.plans) + list(f.reference.values()):
        every = predicted_collectives(p, graph)
        issued = issued_collectives(p, graph, apply_mode(graph, p))
        # the parameters' own collectives: as many bytes per kind, axis and phase, in one call
        # per group where they are grouped (``comms._bucketed``)
        own = lambda cs: Counter({(c.kind, c.axis, c.phase): 0 for c in cs})  # noqa: E731
        mine = own([c for c in every if is_parameter_collective(c)])
        for c in every:
            if is_parameter_collective(c):
                mine[c.kind, c.axis, c.phase] += c.bytes
        sent = own([c for c in issued if is_parameter_collective(c)])
        for c in issued:
            if is_parameter_collective(c):
                sent[c.kind, c.axis, c.phase] += c.bytes
        assert sent == mine, p.summary
        predicted = Counter(c for c in every if not is_parameter_collective(c))
        priced = Counter(c for c in issued if c.priced and not is_parameter_collective(c))
        assert not priced - predicted, p.summary
        assert all(c.where.startswith(PRICED_NOT_ISSUED) for c in predicted - priced), p.summary
        unpriced = [c.where for c in issued if not c.priced]
        assert all(w.startswith(APPLY_ONLY) for w in unpriced), p.summary
        extras.update(next(x for x in APPLY_ONLY if w.startswith(x)) for w in unpriced)
    assert set(extras) == set(APPLY_ONLY), "both extras occur on these frontiers"


def test_issued_tied_moves_start_from_the_first_users_layout():
    graph = _graph("gpt-tiny")
    f = tensoropt.frontier("gpt-tiny", "cpu:2", pipeline=False, progress=False, zero=False, recompute=False)
    (i, k), = tied_uses(graph)
    first = next(j for j, op in enumerate(graph.operators) if graph.operators[i].param_names[k] in op.param_names)
    for p in f.plans:
        issued = [c for c in issued_collectives(p, graph, "dtensor") if c.where.startswith("tied")]
        same = OpConfig.parse(p.ops[first].config).splits == OpConfig.parse(p.ops[i].config).splits
        assert all(not c.priced for c in issued)
        if same:
            assert not issued


def test_relayout_table():
    shape = (4,)
    n = 1024.0
    kinds = lambda cs: [(c.kind, c.phase) for c in cs]  # noqa: E731
    assert kinds(relayout_collectives(n, (REPLICATE,), (Shard(0),), (False,), (False,), shape)) == \
        [("all_gather", "backward")]
    s01 = relayout_collectives(n, (Shard(0),), (Shard(1),), (False,), (False,), shape)
    assert kinds(s01) == [("all_to_all", "forward"), ("all_to_all", "backward")] and s01[0].bytes == n / 4
    assert relayout_collectives(n, (Shard(0),), (Shard(1),), (True,), (False,), shape) == []
    assert kinds(relayout_collectives(n, (REPLICATE,), (REPLICATE,), (False,), (True,), shape)) == \
        [("all_reduce", "backward")]
    # another axis' shard divides what this axis moves; an axis of one device moves nothing
    two = relayout_collectives(n, (REPLICATE, Shard(0)), (Shard(1), Shard(0)), (False, True), (False, False), (2, 4))
    assert two == [Collective("all_gather", 0, n / 4, "backward")]
    assert relayout_collectives(n, (REPLICATE,), (Shard(0),), (False,), (True,), (1,)) == []


def test_tied_copy_is_made_where_the_later_user_wants_another_layout():
    graph = _graph("gpt-tiny")
    (i, k), = tied_uses(graph)
    lm = graph.operators[i]
    f = next(j for j, op in enumerate(graph.operators) if lm.param_names[k] in op.param_names)
    emb, kf = graph.operators[f], graph.operators[f].param_names.index(lm.param_names[k])
    tr = TrainingConfig()
    whole = 4 * lm.operands[k].numel                       # fp32 parameters

    def copy(e, u, shape, zero=0):
        return tied_copy(emb, kf, OpConfig.parse(e), lm, k, OpConfig.parse(u), shape, tr, zero)

    assert copy("h", "b", (4,)) == (whole, False)            # stored split by hidden, wanted whole
    assert copy("v", "n", (4,)) == (0.0, False)               # both split the vocabulary rows
    assert copy("h", "k", (4,)) == (0.0, False)               # both split the hidden columns
    assert copy("v", "k", (4,)) == (whole / 4, False)         # rows stored, columns wanted
    assert copy("b", "b", (4,), zero=3) == (0.0, False)       # data parallel: FSDP2's own gather
    # ZeRO shards the stored weight over the embedding's data-parallel axis: the later use
    # gathers it, and under ZeRO-3 gathers it again for backward instead of keeping it
    assert copy("b,h", "s,k", (2, 2), zero=2) == (whole / 2, False)
    assert copy("b,h", "s,k", (2, 2), zero=3) == (whole / 2, True)
    assert copy("b,h", "s,k", (2, 2), zero=0) == (0.0, False)


@pytest.mark.parametrize("model, devices", [("gpt-tiny", "cpu:4"), ("gpt-tiny", "2x4xA100-80GB"),
                                            ("cnn-tiny", "8xA100-80GB")])
def test_edge_tables_price_each_move_by_the_relayout_rule(model, devices):
    # the tables are priced axis by axis; each entry must equal the whole move priced by
    # ``relayout_moves`` through ``CostModel.moves_s``, and its buffers the largest axis's
    import numpy as np

    from tensoropt.cost_terms import CostTerms
    from tensoropt.costmodel import _axis_forward_bytes, _axis_transient_bytes, edge_tables
    from tensoropt.mesh import CPU_LINK_NAME
    from tensoropt.space import distinct_meshes
    from tensoropt.strategy import enumerate_configs, output_placements, term_placements
    from tensoropt.traffic import aligned, axis_moves, grad_partial, relayout_moves

    graph = _graph(model)
    cluster = parse_devices(devices)
    cm = CostModel(cluster.device, training=TrainingConfig("fp32"),
                   terms=CostTerms(relayout_scale=0.37, per_collective_s=1e-5))
    checked = 0
    for mesh in distinct_meshes(cluster, 3):
        if mesh.ndim < 2 and checked:
            continue
        cfgs = [enumerate_configs(op, mesh) for op in graph.operators]
        for e in graph.edges[:12]:
            table, held, ahead = edge_tables(cm, graph, e, cfgs[e.src], cfgs[e.dst], mesh)
            src, dst = graph.operators[e.src], graph.operators[e.dst]
            term, spec = dst.terms[0][e.operand], dst.operands[e.operand]
            nbytes = spec.nbytes * cm.training.scale(spec)
            on_cpu = [lk.name == CPU_LINK_NAME for lk in mesh.links]
            for i, sc in enumerate(cfgs[e.src]):
                h = output_placements(src, sc)
                for j, dc in enumerate(cfgs[e.dst]):
                    w = term_placements(dc, term)
                    same = tuple(aligned(a, b, e.dim_map) for a, b in zip(h, w))
                    moves = relayout_moves(nbytes, h, w, same, grad_partial(dc, term), mesh.shape)
                    assert table[i, j, 0] == cm.moves_s(moves, mesh)
                    axes = list(axis_moves(nbytes, h, w, mesh.shape))
                    assert held[i, j] == max([_axis_transient_bytes(p, n, x, y, same[a], on_cpu[a])
                                              for a, p, n, x, y in axes] + [0.0])
                    assert ahead[i, j] == max([_axis_forward_bytes(p, n, x, y, same[a], on_cpu[a])
                                               for a, p, n, x, y in axes] + [0.0])
                    checked += 1
            assert not table[..., 1].any()
    assert checked > 1000


def test_a_groups_parameters_share_one_collectives_fixed_costs():
    """FSDP2 reduces a replicated plan's gradients one call per group (each repeated block, and
    the root): its parameters' shares of the fixed costs add up to one per group, so an
    all-data-parallel plan pays the ring's latency once per group and axis, not per parameter.
    A model-parallel operator's ZeRO-2 and -3 collectives are issued one call each and pay in full."""
    graph = _graph("gpt-tiny")
    shares = latency_shares(graph)
    groups = {}
    for op in graph.operators:
        for pname in op.param_names:
            if pname is not None:
                groups.setdefault(gradient_group(graph, op), set()).add(pname)
    assert set(groups) == set(graph.block_modules) | {""}
    for names in groups.values():
        assert sum(shares[p] for p in names) == pytest.approx(1.0)
        assert all(0 < shares[p] < 1 for p in names)

    devices = "8xA100-80GB"
    mesh = parse_devices(devices)
    dp = tensoropt.plan_for("gpt-tiny", devices, dp=8)
    cm = CostModel(mesh.device, training=TrainingConfig.of_plan(dp.training))
    grads = [c for c in predicted_collectives(dp, graph) if is_gradient_reduction(c)]
    assert sum(c.latency_share for c in grads) == pytest.approx(len(groups))
    # the plan's price: bandwidth per parameter, the latency once per group
    m = _mesh(dp)
    p, alpha = m.axis_size(0), m.latency_s(0)
    bandwidth = sum(cm.collectives.time_s(c.kind, c.bytes, m, c.axis, 0.0) for c in grads)
    assert cm.price(grads, m) == pytest.approx(bandwidth + len(groups) * 2 * (p - 1) * alpha, rel=1e-9)

    # without ZeRO the DTensor runner buckets every gradient by group too, and under ZeRO-1 it
    # gathers and reduce-scatters a group's sharded parameters together; under ZeRO-2 and -3
    # it moves a model-parallel operator's one by one
    tp = tensoropt.plan_for("gpt-tiny", devices, dp=4, tp=2)
    shape = tuple(tp.mesh_shape)
    for zero in (0, 1, 2, 3):
        sharded = 0
        for op, c in zip(tp.ops, graph.operators):
            cfg = OpConfig.parse(op.config)
            mine = operator_collectives(c, cfg, shape, TrainingConfig.of_plan(tp.training), True, zero, shares)
            if model_parallel(cfg, shape) and mine:
                sharded += 1
                assert all((x.latency_share == 1.0) == (zero >= 2) for x in mine), (zero, op.name)
        assert sharded


def test_zero_2_and_3_batch_only_operators_pay_per_parameter_unless_fsdp_runs_the_plan():
    """Under ZeRO-2 and -3 the DTensor runner moves every parameter on its own, a batch-only
    operator's too, each one call; FSDP2, which runs the plan whose every operator splits the
    batch, groups them. The cost graph prices the first, and that one plan apart
    (``MeshProblem.replicate_time_s``): its plan, the search's and ``plan_for``'s, is priced
    grouped, and the priced list of collectives says so."""
    from tensoropt.cost_terms import CostTerms
    from tensoropt.mesh import mesh_for
    from tensoropt.plan_builder import assignment_of
    from tensoropt.planner import build_problem
    from tensoropt.traffic import owners

    graph = _graph("gpt-tiny")
    cluster = parse_devices("cpu:2")
    mesh = mesh_for((2,), cluster)
    training = TrainingConfig("fp32")
    per_call = 1e-3
    cm = CostModel(cluster.device, training=training, terms=CostTerms(per_collective_s=per_call))
    shares = latency_shares(graph)
    for zero in (2, 3):
        problem = build_problem(graph, mesh, cm, zero_stage=zero)
        rep = problem.replicate_configs
        assert rep is not None and problem.replicate_time_s is not None
        checked = 0
        for i, (op, owns) in enumerate(zip(graph.operators, owners(graph))):
            cfg = problem.configs[i][rep[i]]
            calls = operator_collectives(op, cfg, mesh.shape, training, owns, zero, shares)
            if not any(is_parameter_collective(c) for c in calls):
                assert problem.replicate_time_s[i] == 0
                continue
            assert not model_parallel(cfg, mesh.shape)
            assert all(c.latency_share == 1.0 for c in calls), op.name
            grouped = operator_collectives(op, cfg, mesh.shape, training, owns, zero, shares, fsdp=True)
            assert [c.bytes for c in grouped] == [c.bytes for c in calls]
            assert all(c.latency_share < 1.0 for c in grouped if is_parameter_collective(c)), op.name
            # one call each: the fitted per-call term and a ring's latency per parameter
            saved = -problem.replicate_time_s[i]
            assert saved > per_call * sum(1 - c.latency_share for c in grouped), op.name
            checked += 1
        assert checked >= 4
        a = list(rep) + [0] * len(problem.units)
        assert problem.time_of(a) == pytest.approx(problem.cost_graph.cost(a)[0] + problem.replicate_time_s.sum())
        assert problem.time_of(a) < problem.cost_graph.cost(a)[0]
        # a plan that also splits a weight runs on DTensor: priced as its cost graph says
        other = list(a)
        i = next(i for i, op in enumerate(graph.operators) if any(op.param_names)
                 and any(model_parallel(c, mesh.shape) for c in problem.configs[i]))
        other[i] = next(j for j, c in enumerate(problem.configs[i]) if model_parallel(c, mesh.shape))
        assert problem.time_of(other) == problem.cost_graph.cost(other)[0]

        plan = tensoropt.plan_for("gpt-tiny", "cpu:2", dp=2, zero=zero)
        assert apply_mode(graph, plan) == "replicate"
        default = CostModel(cluster.device, training=TrainingConfig.of_plan(plan.training))
        fresh = build_problem(graph, mesh, default, zero_stage=zero, recompute=False)
        fa = assignment_of(plan, fresh, graph)
        assert fresh.is_replicate(fa)[0]
        assert plan.time_s == pytest.approx(fresh.time_of(fa), rel=1e-12)
        assert plan.time_s < fresh.cost_graph.cost(fa)[0]
        colls = predicted_collectives(plan, graph)
        assert default.price(colls, mesh) == pytest.approx(plan.breakdown["comm_s"] + plan.breakdown["relayout_s"],
                                                           rel=1e-12)
        assert all(c.latency_share < 1.0 for c in colls if is_parameter_collective(c))


def test_a_search_prices_the_dtensor_runners_per_operator_cost_on_every_plan_but_fsdp2s(tmp_path):
    """``per_dtensor_op_s`` charges every torch op of a plan the DTensor runner runs; the plan
    FSDP2 runs (every operator splitting the batch) does not pay it. With the term large, that
    plan must be the frontier's fastest, at its own price: the search, its bounds and the
    plan's price all see the FSDP2 plan apart."""
    from tensoropt.calibration import step_features
    from tensoropt.cost_terms import CostTerms

    path = tmp_path / "terms.json"
    terms = CostTerms(per_dtensor_op_s=0.5)
    terms.save(path)
    f = tensoropt.frontier("mlp-tiny", "cpu:2", pipeline=False, progress=False, max_mesh_dims=1,
                           calibration=str(path))
    graph = _graph("mlp-tiny")
    fastest = min(f.plans, key=lambda p: p.time_s)
    assert apply_mode(graph, fastest) == "replicate", fastest.summary
    feats = step_features(fastest, graph)
    assert feats["dtensor_ops"] == 0
    assert terms.predict(feats) == pytest.approx(fastest.time_s, rel=1e-9)
    slow = [p for p in f.plans if apply_mode(graph, p) == "dtensor"]
    assert slow, "the frontier keeps DTensor plans (less memory)"
    for p in slow:
        feats = step_features(p, graph)
        assert feats["dtensor_ops"] == pytest.approx(sum(op.dispatches for op in graph.operators))
        assert terms.predict(feats) == pytest.approx(p.time_s, rel=1e-9)

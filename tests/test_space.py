"""The coarse search space for large clusters, and graphs at other batch sizes without export."""

from __future__ import annotations

import math

import pytest

import tensoropt
from tensoropt.capture.rebatch import interpolator
from tensoropt.mesh import parse_devices
from tensoropt.capture.recapture import capture_model
from tensoropt.space import COARSE_ABOVE, SearchSpace


def test_coarse_is_automatic_above_the_threshold():
    assert not SearchSpace.for_cluster(parse_devices("8x8xA100-80GB")).coarse       # 64 devices
    assert SearchSpace.for_cluster(parse_devices("16x8xA100-80GB")).coarse
    assert not SearchSpace.for_cluster(parse_devices("16x8xA100-80GB"), coarse=False).coarse
    assert COARSE_ABOVE == 64


def test_coarse_meshes_cross_nodes_only_on_the_first_axis():
    cluster = parse_devices("16x8xA100-80GB")
    full, coarse = SearchSpace(2, False), SearchSpace(2, True)
    kept = coarse.meshes(cluster)
    assert {str(m) for m in kept} < {str(m) for m in full.meshes(cluster)}
    for m in kept:
        assert all(cluster.per_node % math.prod(m.shape[a:]) == 0 for a in range(1, m.ndim))
        assert coarse.batch_only_axes(m, cluster) == ((0,) if m.size > 1 else ())
        assert full.batch_only_axes(m, cluster) == ()
    one_node = parse_devices("8xA100-80GB")   # nothing crosses a node
    assert all(coarse.batch_only_axes(m, one_node) == () for m in coarse.meshes(one_node))


def test_coarse_frontier_splits_only_the_batch_across_nodes():
    f = tensoropt.frontier("gpt-tiny", "16x8xA100-80GB", max_mesh_dims=2, pipeline=False, progress=False)
    assert f.stats["search_space"] == {"max_mesh_dims": 2, "coarse": True, "block_groups": 8}
    for plan in f.plans:
        for op in plan.ops:
            assert op.config.split(",")[0] in ("-", "b"), (plan.summary, op.name, op.config)

    # the full space contains the coarse one: where both are searched exactly on the peak, the
    # full frontier is at least as good everywhere (bert-tiny: gpt-tiny's full-space problem
    # here is just beyond the exact search's budget)
    small = {coarse: tensoropt.frontier("bert-tiny", "2x1xA100-80GB", max_mesh_dims=1, pipeline=False, zero=False,
                                        coarse=coarse, progress=False, references=False) for coarse in (True, False)}
    assert all(set(s.stats["peak_search"]) == {"exact"} for s in small.values())
    assert small[True].stats["search_space"]["coarse"] and not small[False].stats["search_space"]["coarse"]
    assert len(small[False]) > len(small[True])
    assert tensoropt.engine.covers(list(zip(small[False].times_s, small[False].memories_bytes)),
                                   list(zip(small[True].times_s, small[True].memories_bytes)), 1e-12)


@pytest.mark.parametrize("name", ["gpt-tiny", "cnn-tiny", "bert-tiny"])
def test_graph_at_another_batch_equals_a_fresh_capture(name):
    graph, _, recapture = capture_model(name)
    b = graph.batch_size
    half = recapture(b // 2)                 # a real capture: it fits the interpolation
    assert recapture.at is not None
    quarter = recapture(b // 4)              # interpolated
    assert quarter == recapture.capture_at(b // 4)
    assert half.batch_size == b // 2 and quarter.batch_size == b // 4


def test_a_capture_at_batch_one_leaves_interpolation_to_the_next(monkeypatch):
    """Pipelines ask for micro-batches of one first as often as not: that capture cannot fit
    the interpolation, so the next capture at another batch is the one that does, and the
    batches after it are interpolated, not exported again."""
    graph, _, recapture = capture_model("gpt-tiny")
    b = graph.batch_size
    exported = []
    real = recapture.capture_at
    monkeypatch.setattr(recapture, "capture_at", lambda n: exported.append(n) or real(n))
    recapture(1)
    assert recapture.at is None
    recapture(b // 2)
    assert recapture.at is not None
    quarter = recapture(b // 4)
    assert exported == [1, b // 2] and quarter == real(b // 4)


def test_interpolation_refuses_graphs_that_differ_beyond_the_batch():
    tiny, _, _ = capture_model("gpt-tiny")
    llama, _, _ = capture_model("llama-tiny")
    assert interpolator(tiny, llama) is None
    assert interpolator(tiny, tiny) is None           # one batch size fixes nothing
    graph, _, recapture = capture_model("gpt-tiny")
    recapture(graph.batch_size // 2)
    assert recapture.at(1) is None                    # batch 1 is always captured for real


def test_zoo_model_with_given_inputs_keeps_their_sequence_length_at_other_batches():
    from tensoropt.models import example_inputs

    graph, _, recapture = capture_model("gpt-tiny", example_inputs("gpt-tiny", 8, seq_len=8), None)
    half = recapture(4)
    assert graph.operators[0].operands[0].shape == (8, 8)
    assert half.operators[0].operands[0].shape == (4, 8)        # not the zoo default of 16

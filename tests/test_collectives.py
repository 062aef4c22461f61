import pytest
from hypothesis import given, strategies as st

from tensoropt.collectives import (COLLECTIVE_KINDS, CollectiveModel, CollectiveParams, all_gather_s,
                                   all_reduce_s, all_to_all_s, broadcast_s, reduce_scatter_s,
                                   send_recv_s)
from tensoropt.mesh import enumerate_meshes

FUNCS = [all_reduce_s, all_gather_s, reduce_scatter_s, all_to_all_s, send_recv_s, broadcast_s]
ALPHA_S = 1e-5
B = 1e11

nbytes_st = st.floats(min_value=1.0, max_value=1e12)
p_st = st.integers(min_value=1, max_value=2048)


@pytest.mark.parametrize("f", FUNCS)
def test_one_rank_or_empty_buffer_costs_nothing(f):
    assert f(1e9, 1, ALPHA_S, B) == 0.0
    assert f(0, 8, ALPHA_S, B) == 0.0


@pytest.mark.parametrize("f", FUNCS)
@given(n=nbytes_st, extra=st.floats(min_value=0.0, max_value=1e12), p=p_st)
def test_monotone_in_bytes(f, n, extra, p):
    assert f(n + extra, p, ALPHA_S, B) >= f(n, p, ALPHA_S, B)


@pytest.mark.parametrize("f", FUNCS)
@given(n=nbytes_st, p=p_st)
def test_monotone_in_ranks(f, n, p):
    assert f(n, p + 1, ALPHA_S, B) >= f(n, p, ALPHA_S, B)


@given(n=nbytes_st, p=p_st)
def test_all_reduce_is_reduce_scatter_plus_all_gather(n, p):
    assert all_reduce_s(n, p, ALPHA_S, B) == pytest.approx(
        reduce_scatter_s(n, p, ALPHA_S, B) + all_gather_s(n, p, ALPHA_S, B))


def test_hand_computed_values():
    n, p, a, b = 1e9, 4, 1e-5, 1e11        # 1 GB over 4 ranks, 10 us, 100 GB/s
    assert all_reduce_s(n, p, a, b) == pytest.approx(6e-5 + 1.5 * 1e-2)   # 2*3*a + 2*3/4 * n/b
    assert all_gather_s(n, p, a, b) == pytest.approx(3e-5 + 0.75e-2)
    assert reduce_scatter_s(n, p, a, b) == pytest.approx(3e-5 + 0.75e-2)
    assert all_to_all_s(n, p, a, b) == pytest.approx(3e-5 + 0.75e-2)
    assert broadcast_s(n, p, a, b) == pytest.approx(3e-5 + 1e-2)
    assert send_recv_s(n, p, a, b) == pytest.approx(1e-5 + 1e-2)


@pytest.mark.parametrize("args", [(-1, 4, ALPHA_S, B), (1e6, 0, ALPHA_S, B), (1e6, 2.5, ALPHA_S, B),
                                  (1e6, 4, -1.0, B), (1e6, 4, ALPHA_S, 0.0),
                                  (float("nan"), 4, ALPHA_S, B)])
def test_bad_arguments(args):
    with pytest.raises(ValueError):
        all_reduce_s(*args)


def test_model_defaults_match_raw_formulas_on_mesh_axes():
    model = CollectiveModel()
    mesh = {m.shape: m for m in enumerate_meshes("4x8xH100")}[(4, 8)]
    for axis in (0, 1):
        p, a, b = mesh.shape[axis], mesh.latency_s(axis), mesh.bandwidth_bytes_per_s(axis)
        assert model.time_s("all_reduce", 1e8, mesh, axis) == pytest.approx(all_reduce_s(1e8, p, a, b))
        assert model.time_s("send_recv", 1e8, mesh, axis) == pytest.approx(send_recv_s(1e8, p, a, b))
    # the inter-node axis is slower than the NVLink axis for the same buffer
    assert model.time_s("all_gather", 1e8, mesh, "m0") > model.time_s("all_gather", 1e8, mesh, "m1")
    for kind in COLLECTIVE_KINDS:
        assert model.params(kind) == CollectiveParams()


def test_model_calibration_scales_alpha_and_bandwidth():
    cal = CollectiveModel(all_reduce=CollectiveParams(alpha_scale=2.0, bandwidth_efficiency=0.5,
                                                      base_s=1e-6))
    got = cal.raw_time_s("all_reduce", 1e9, 4, ALPHA_S, B)
    assert got == pytest.approx(1e-6 + all_reduce_s(1e9, 4, 2 * ALPHA_S, 0.5 * B))
    assert cal.raw_time_s("all_reduce", 1e9, 1, ALPHA_S, B) == 0.0
    assert cal.raw_time_s("all_gather", 1e9, 4, ALPHA_S, B) == pytest.approx(all_gather_s(1e9, 4, ALPHA_S, B))


def test_model_rejects_unknown_kind_and_bad_calibration():
    with pytest.raises(ValueError, match="all_reduce"):
        CollectiveModel().raw_time_s("allreduce", 1e6, 4, ALPHA_S, B)
    with pytest.raises(ValueError):
        CollectiveParams(bandwidth_efficiency=0.0)

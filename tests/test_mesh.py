import math

import pytest

from tensoropt.hardware import get_device
from tensoropt.mesh import MAX_MESHES, Cluster, Mesh, enumerate_meshes, parse_devices


def test_parse_single_node():
    c = parse_devices("8xA100-80GB")
    assert (c.device.name, c.n_nodes, c.per_node, c.world_size) == ("A100-80GB", 1, 8, 8)
    assert c.intra_link.name == "nvlink3" and c.inter_link.name == "ib-hdr"


def test_parse_nodes_times_gpus():
    c = parse_devices("4x8xH100")
    assert (c.device.name, c.n_nodes, c.per_node, c.world_size) == ("H100", 4, 8, 32)
    assert c.intra_link.name == "nvlink4" and c.inter_link.name == "ib-ndr"


def test_parse_splits_into_nodes_of_eight():
    c = parse_devices("16xA100-80GB")
    assert (c.n_nodes, c.per_node) == (2, 8)
    assert parse_devices("4xH200").n_nodes == 1


def test_parse_cpu_and_passthrough():
    c = parse_devices("cpu:4")
    assert (c.device.name, c.n_nodes, c.per_node) == ("cpu", 1, 4)
    assert c.intra_link.name == c.inter_link.name == "gloo-loopback"
    assert parse_devices(c) is c
    assert parse_devices(" 2 x 8 x h100-80gb ").world_size == 16


@pytest.mark.parametrize("bad, needle", [
    ("0xA100", "'0'"), ("2.5xA100", "'2.5'"), ("-1xA100-80GB", "'-1'"), ("cpu:0", "'0'"),
    ("8xTPU-v5p", "TPU-v5p"), ("garbage", "garbage"), ("", "''"), ("12xA100-80GB", "12"),
    ("2x0xH100", "'0'"), ("cpu:two", "two"),
])
def test_parse_errors_are_clear(bad, needle):
    with pytest.raises(ValueError) as err:
        parse_devices(bad)
    msg = str(err.value)
    assert needle in msg
    assert "known devices" in msg or "expected" in msg or "explicitly" in msg


def test_unknown_device_lists_known_names():
    with pytest.raises(ValueError, match="A100-80GB"):
        parse_devices("8xTPU-v5p")


def shapes(cluster):
    return [m.shape for m in enumerate_meshes(cluster)]


def test_eight_devices_one_node():
    got = shapes("8xA100-80GB")
    assert got == [(8,), (2, 4), (4, 2), (2, 2, 2)]
    for m in enumerate_meshes("8xA100-80GB"):
        assert all(link.name == "nvlink3" for link in m.links)


@pytest.mark.parametrize("spec", ["8xH100", "4x8xH100", "2x8xA100-80GB", "cpu:6", "3x8xV100-32GB",
                                  "128x8xH100", "2x3xH100"])
def test_products_equal_world_size_and_order_is_deterministic(spec):
    cluster = parse_devices(spec)
    meshes = enumerate_meshes(cluster)
    assert meshes, spec
    assert all(math.prod(m.shape) == cluster.world_size for m in meshes)
    assert all(all(s > 1 for s in m.shape) for m in meshes)
    assert all(1 <= m.ndim <= 3 and len(m.links) == len(m.axis_names) == m.ndim for m in meshes)
    assert len({m.shape for m in meshes}) == len(meshes)
    assert [m.shape for m in meshes] == [m.shape for m in enumerate_meshes(cluster)]
    assert [m.shape for m in meshes] == sorted((m.shape for m in meshes), key=lambda s: (len(s), s))


def test_links_on_four_nodes_of_eight():
    by_shape = {m.shape: m for m in enumerate_meshes("4x8xH100")}
    m = by_shape[(4, 8)]
    assert [link.name for link in m.links] == ["ib-ndr", "nvlink4"]
    assert str(m) == "4x8(ib-ndr,nvlink4)"
    assert m.bandwidth_bytes_per_s(1) == pytest.approx(450e9)
    assert m.bandwidth_bytes_per_s("m0") == pytest.approx(50e9)
    assert m.latency_s(0) > m.latency_s(1)
    # 2x16: the 16-rank axis spans two nodes, so it is charged the inter-node link
    assert [link.name for link in by_shape[(2, 16)].links] == ["ib-ndr", "ib-ndr"]
    assert [link.name for link in by_shape[(8, 2, 2)].links] == ["ib-ndr", "nvlink4", "nvlink4"]
    assert [link.name for link in by_shape[(32,)].links] == ["ib-ndr"]


def test_misaligned_layouts_are_skipped():
    # 2 nodes of 3: a trailing axis of 2 would straddle node boundaries
    assert shapes("2x3xH100") == [(6,), (2, 3)]


def test_single_device_and_max_dims():
    assert shapes("1xH100") == [(1,)]
    assert shapes("cpu:1") == [(1,)]
    assert shapes(parse_devices("8xH100")) == [(8,), (2, 4), (4, 2), (2, 2, 2)]
    assert [m.shape for m in enumerate_meshes("8xH100", max_dims=1)] == [(8,)]
    assert all(m.ndim <= 2 for m in enumerate_meshes("4x8xH100", max_dims=2))


def test_large_cluster_stays_modest():
    assert len(enumerate_meshes("128x8xH100")) < MAX_MESHES
    assert len(enumerate_meshes("90x8xH100")) <= MAX_MESHES


def test_mesh_validation():
    link = parse_devices("8xH100").intra_link
    with pytest.raises(ValueError):
        Mesh((2, 4), ("a",), (link, link))
    m = Mesh((2, 4), ("dp", "tp"), (link, link))
    assert m.axis_size("tp") == 4 and m.size == 8
    with pytest.raises(ValueError, match="pp"):
        m.latency_s("pp")


def test_cluster_is_frozen_value():
    c = parse_devices("2x8xH100")
    assert c == Cluster(get_device("H100"), 2, 8, c.intra_link, c.inter_link)
    hash(c)

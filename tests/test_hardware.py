import dataclasses

import pytest

from tensoropt.hardware import (DATA_DIR, DTYPES, get_device, get_link, inter_link, intra_link,
                                load_catalogue)

GPUS = ["V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100", "H200"]
#: rented parts added later: PCIe-only cards, then the MI300X (xGMI) and B200 (NVLink 5) platforms
PCIE_ONLY = ["L4", "A10G", "L40S", "RTX-4090"]
NEW_GPUS = PCIE_ONLY + ["MI300X", "B200"]


def test_data_dir_exists():
    assert (DATA_DIR / "gpus.json").is_file() and (DATA_DIR / "links.json").is_file()


def test_catalogue_has_every_gpu_with_source_and_dtypes():
    cat = load_catalogue()
    for name in GPUS + NEW_GPUS + ["cpu"]:
        dev = cat.devices[name]
        assert dev.source.strip()
        assert dev.memory_bytes > 0 and dev.hbm_bytes_per_s > 0
        assert set(dev.peak_flops_per_s) == set(DTYPES)
        assert all(v > 0 for v in dev.peak_flops_per_s.values())
    for link in cat.links.values():
        assert link.source.strip() and link.latency_s > 0 and link.bandwidth_bytes_per_s > 0
    for name in ["nvlink2", "nvlink3", "nvlink4", "nvlink5", "xgmi", "pcie4", "ib-hdr", "ib-ndr", "efa",
                 "gloo-loopback"]:
        assert name in cat.links


def test_catalogue_is_cached():
    assert load_catalogue() is load_catalogue()


def test_known_figures():
    h100 = get_device("H100")
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)      # dense, not the sparse 1979
    assert h100.peak_flops("torch.bfloat16") == h100.peak_flops("bf16")
    assert get_device("A100-80GB").memory_bytes == 80 * 10**9
    assert get_device("V100-32GB").peak_flops("bf16") == get_device("V100-32GB").peak_flops("fp32")
    assert get_device("cpu").placeholder


def test_lookup_is_case_insensitive_with_aliases():
    assert get_device("h100-80gb") is get_device("H100")
    assert get_device("  a100-80GB ") is get_device("A100-80GB")
    assert get_link("NVLink4") is get_link("nvlink4")


def test_unknown_device_lists_known_names():
    with pytest.raises(ValueError) as err:
        get_device("TPU-v5p")
    msg = str(err.value)
    assert "TPU-v5p" in msg
    assert all(name in msg for name in GPUS + NEW_GPUS)
    with pytest.raises(ValueError, match="nvlink4"):
        get_link("carrier-pigeon")


def test_device_links_use_per_gpu_bandwidth():
    a100 = get_device("A100-80GB")
    assert intra_link(a100).name == "nvlink3"
    assert intra_link(a100).bandwidth_bytes_per_s == pytest.approx(300e9)
    assert inter_link(a100).name == "ib-hdr"
    assert inter_link(a100).bandwidth_bytes_per_s == pytest.approx(25e9)
    assert inter_link(get_device("H200")).bandwidth_bytes_per_s == pytest.approx(50e9)


def test_device_is_frozen_and_hashable():
    dev = get_device("H200")
    hash(dev)
    with pytest.raises(dataclasses.FrozenInstanceError):
        dev.name = "x"


# ---------------------------------------------------------------- rented GPUs (L4 ... B200)

def _raw_entries():
    import json
    with open(DATA_DIR / "gpus.json", encoding="utf-8") as f:
        gpus = json.load(f)["devices"]
    with open(DATA_DIR / "links.json", encoding="utf-8") as f:
        links = json.load(f)["links"]
    return gpus, links


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_device_parses_as_one_node_of_eight(name):
    from tensoropt.mesh import parse_devices
    c = parse_devices(f"8x{name}")
    assert (c.device.name, c.n_nodes, c.per_node, c.world_size) == (name, 1, 8, 8)
    assert c.device.per_node == 8
    assert c.intra_link == intra_link(c.device) and c.inter_link == inter_link(c.device)


@pytest.mark.parametrize("spec, name, nodes", [
    ("16xL40S", "L40S", 2), ("24xL4", "L4", 3), ("16xA10G", "A10G", 2), ("32xRTX-4090", "RTX-4090", 4),
    ("16xMI300X", "MI300X", 2), ("64xB200", "B200", 8), ("2x8xmi300x", "MI300X", 2),
])
def test_new_device_multi_node_specs_split_into_nodes_of_per_node(spec, name, nodes):
    from tensoropt.mesh import parse_devices
    c = parse_devices(spec)
    assert (c.device.name, c.n_nodes, c.per_node) == (name, nodes, 8)
    # more than one node: the mesh's outer axis crosses the NIC, not the intra-node link
    assert c.inter_link.name == get_device(name).nic_link_name


def test_new_device_split_error_names_the_node_size():
    from tensoropt.mesh import parse_devices
    with pytest.raises(ValueError, match="nodes of 8"):
        parse_devices("12xL40S")


@pytest.mark.parametrize("name", PCIE_ONLY)
def test_pcie_only_parts_use_the_pcie4_tier(name):
    dev = get_device(name)
    link = intra_link(dev)
    assert link.name == "pcie4"
    assert link.bandwidth_bytes_per_s == pytest.approx(31.5e9)    # Gen4 x16, per direction
    assert link.latency_s == get_link("pcie4").latency_s


def test_platform_links_of_mi300x_and_b200():
    b200, mi300x = get_device("B200"), get_device("MI300X")
    assert intra_link(b200).name == "nvlink5"
    assert intra_link(b200).bandwidth_bytes_per_s == pytest.approx(900e9)   # 1.8 TB/s bidirectional
    assert intra_link(mi300x).name == "xgmi"
    assert intra_link(mi300x).bandwidth_bytes_per_s == pytest.approx(7 * 64e9)
    for dev in (b200, mi300x):                                               # 400 Gb/s per GPU
        assert inter_link(dev).name == "ib-ndr"
        assert inter_link(dev).bandwidth_bytes_per_s == pytest.approx(50e9)


def test_link_tiers_are_ordered():
    bw = {name: get_link(name).bandwidth_bytes_per_s for name in
          ["pcie4", "nvlink2", "nvlink3", "nvlink4", "nvlink5", "xgmi"]}
    assert bw["pcie4"] < bw["nvlink2"] < bw["nvlink3"] < bw["nvlink4"] < bw["nvlink5"]
    assert bw["pcie4"] < bw["xgmi"] < bw["nvlink5"]
    lat = {name: get_link(name).latency_s for name in ["nvlink4", "nvlink5", "xgmi", "pcie4", "efa", "ib-ndr"]}
    assert lat["nvlink5"] == lat["nvlink4"] < lat["pcie4"] < lat["ib-ndr"] <= lat["efa"]
    assert lat["nvlink5"] < lat["xgmi"] < lat["pcie4"]
    # per device: the intra-node link is faster than its NIC, PCIe parts slower than any NVLink part
    for name in GPUS + NEW_GPUS:
        dev = get_device(name)
        assert intra_link(dev).bandwidth_bytes_per_s > inter_link(dev).bandwidth_bytes_per_s
    slowest_nvlink = min(intra_link(get_device(n)).bandwidth_bytes_per_s for n in GPUS + ["B200"])
    assert all(intra_link(get_device(n)).bandwidth_bytes_per_s < slowest_nvlink for n in PCIE_ONLY)


def test_new_device_figures():
    l40s, b200, mi300x = get_device("L40S"), get_device("B200"), get_device("MI300X")
    assert l40s.peak_flops("bf16") == pytest.approx(362.05e12)          # dense, not the sparse 733
    assert l40s.memory_bytes == 48 * 10**9 and l40s.hbm_bytes_per_s == pytest.approx(864e9)
    assert b200.memory_bytes == 180 * 10**9                              # the HGX/DGX B200 part
    assert b200.peak_flops("bf16") == pytest.approx(4.5e15 / 2)          # NVIDIA's sparse figure halved
    assert mi300x.memory_bytes == 192 * 10**9
    assert mi300x.peak_flops("torch.bfloat16") == pytest.approx(1307.4e12)
    assert get_device("L4").peak_flops("fp16") == pytest.approx(242e12 / 2)
    assert get_device("RTX-4090").peak_flops("float16") == pytest.approx(165.2e12)   # FP32 accumulate
    # NIC per GPU = instance bandwidth / 8: g5/g6.48xlarge 100 Gbps, g6e.48xlarge 400 Gbps
    assert inter_link(get_device("A10G")).bandwidth_bytes_per_s == pytest.approx(100e9 / 8 / 8)
    assert inter_link(get_device("L4")).bandwidth_bytes_per_s == pytest.approx(100e9 / 8 / 8)
    assert inter_link(l40s).bandwidth_bytes_per_s == pytest.approx(400e9 / 8 / 8)
    for name in NEW_GPUS:
        dev = get_device(name)
        assert not dev.placeholder
        # tensor-core dtypes are at least the fp32 rate; bf16/fp16 at least tf32
        assert dev.peak_flops("fp32") <= dev.peak_flops("tf32") <= dev.peak_flops("bf16") == dev.peak_flops("fp16")


def test_new_devices_aliases_resolve():
    assert get_device("rtx4090") is get_device("RTX-4090")
    assert get_device("B200-180GB") is get_device("B200")
    assert get_device("mi300x-192gb") is get_device("MI300X")
    assert get_device("l40s-48gb") is get_device("L40S")


def test_every_entry_and_tier_carries_a_source():
    gpus, links = _raw_entries()
    for name, e in gpus.items():
        assert isinstance(e.get("source"), str) and len(e["source"].strip()) > 40, name
    for name, e in links.items():
        assert isinstance(e.get("source"), str) and len(e["source"].strip()) > 40, name
    # every new device says in its notes what is inferred or not retrieved
    for name in NEW_GPUS:
        assert gpus[name].get("notes", "").strip(), name
    # pcie4 is sourced now; the placeholders left are the ones a measured profile must replace
    assert not links["pcie4"].get("placeholder", False)
    assert {n for n, e in links.items() if e.get("placeholder")} == {"eth-25g", "gloo-loopback"}

import dataclasses

import pytest

from tensoropt.hardware import (DATA_DIR, DTYPES, get_device, get_link, inter_link, intra_link,
                                load_catalogue)

GPUS = ["V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100", "H200"]


def test_data_dir_exists():
    assert (DATA_DIR / "gpus.json").is_file() and (DATA_DIR / "links.json").is_file()


def test_catalogue_has_every_gpu_with_source_and_dtypes():
    cat = load_catalogue()
    for name in GPUS + ["cpu"]:
        dev = cat.devices[name]
        assert dev.source.strip()
        assert dev.memory_bytes > 0 and dev.hbm_bytes_per_s > 0
        assert set(dev.peak_flops_per_s) == set(DTYPES)
        assert all(v > 0 for v in dev.peak_flops_per_s.values())
    for link in cat.links.values():
        assert link.source.strip() and link.latency_s > 0 and link.bandwidth_bytes_per_s > 0
    for name in ["nvlink2", "nvlink3", "nvlink4", "pcie4", "ib-hdr", "ib-ndr", "gloo-loopback"]:
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
        get_device("B200")
    msg = str(err.value)
    assert "B200" in msg
    assert all(name in msg for name in GPUS)
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

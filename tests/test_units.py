import pytest

from tensoropt.units import format_bytes, format_time, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("40GB", 40 * 10**9),
    ("40 GiB", 40 * 2**30),
    ("80GiB", 80 * 2**30),
    ("512MB", 512 * 10**6),
    ("1.5TB", 1_500_000_000_000),
    ("2kib", 2048),
    ("1024", 1024),
    ("  7 B ", 7),
    (4096, 4096),
    (1.5e9, 1_500_000_000),
])
def test_parse_bytes_good(text, expected):
    assert parse_bytes(text) == expected
    assert isinstance(parse_bytes(text), int)


@pytest.mark.parametrize("bad", ["forty GB", "40 XB", "40Gbit", "GB", "", "1.2.3GB", "40 G B"])
def test_parse_bytes_bad_strings_name_the_input(bad):
    with pytest.raises(ValueError) as err:
        parse_bytes(bad)
    assert repr(bad) in str(err.value)
    assert "GiB" in str(err.value)          # lists accepted forms


@pytest.mark.parametrize("bad", [0, -1, "0GB", -2.5, float("nan"), float("inf"), True, None, [1]])
def test_parse_bytes_rejects_non_positive_and_odd_types(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_format_bytes_and_time():
    assert format_bytes(2**30) == "1.00 GiB"
    assert format_bytes(80 * 10**9) == "74.51 GiB"
    assert format_bytes(3.25 * 2**20) == "3.25 MiB"          # small plans stay readable
    assert format_time(0.0125) == "12.50 ms"
    assert format_time(2.5) == "2.50 s"

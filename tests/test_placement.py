"""tensoropt.placement: the one parser and printer of layouts."""

from __future__ import annotations

import pytest

from tensoropt.placement import (PARTIAL, REPLICATE, Partial, Replicate, Shard, format_placements, parse_placement,
                                 parse_placements)
from tensoropt.strategy import OpConfig, term_placements


def test_round_trip():
    layout = (Shard(0), REPLICATE, Shard(12), PARTIAL)
    assert format_placements(layout) == "S(0),R,S(12),P"
    assert parse_placements("S(0),R,S(12),P") == layout
    assert parse_placement(" R ") == Replicate() and parse_placement("P") == Partial()


@pytest.mark.parametrize("text", ["S(-1)", "S()", "S(1", "X", "", "r", "S(1.0)"])
def test_rejects_what_is_not_a_placement(text):
    with pytest.raises(ValueError, match="placement"):
        parse_placement(text)


def test_shard_needs_a_dimension():
    with pytest.raises(ValueError):
        Shard(-1)
    with pytest.raises(ValueError):
        Shard(True)


def test_term_placements_are_typed():
    cfg = OpConfig(("b", "k", None))
    assert term_placements(cfg, "bsk") == (Shard(0), Shard(2), REPLICATE)
    assert term_placements(cfg, "bsn", contracted="k") == (Shard(0), PARTIAL, REPLICATE)

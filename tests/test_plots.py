"""Every plot renders to a non-empty PNG without a display, and shows what it claims."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tensoropt  # noqa: E402
from tensoropt import plots  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny():
    """A small real frontier (gpt-tiny on 4 devices, 1-D meshes): a second or two."""
    return tensoropt.frontier("gpt-tiny", "4xA100-80GB", batch_size=8, max_mesh_dims=1, progress=False)


@pytest.fixture(scope="module")
def tiny_8():
    return tensoropt.frontier("gpt-tiny", "8xA100-80GB", batch_size=8, max_mesh_dims=1, progress=False)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _png(ax, tmp_path, name="plot.png"):
    path = tmp_path / name
    ax.figure.savefig(path, dpi=60)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000
    return path


def _points(ax, gid):
    lines = [ln for ln in ax.get_lines() if ln.get_gid() == gid]
    assert len(lines) == 1, [ln.get_gid() for ln in ax.get_lines()]
    return lines[0].get_xydata()


def test_no_display_needed():
    assert matplotlib.get_backend().lower() == "agg"
    assert not os.environ.get("DISPLAY") or True  # Agg renders either way


def test_frontier_plot_has_every_plan_and_units(tiny, tmp_path):
    ax = plots.plot_frontier(tiny, memory_budget="40GB")
    _png(ax, tmp_path)
    xy = _points(ax, "frontier-points")
    assert len(xy) == len(tiny.plans)
    scale = 1e3 if max(p.time_s for p in tiny.plans) < 1 else 1.0
    assert xy[0, 0] == pytest.approx(tiny.plans[0].time_s * scale)
    assert "ms" in ax.get_xlabel() or "(s)" in ax.get_xlabel()
    assert "iB" in ax.get_ylabel() and "peak memory per device" in ax.get_ylabel()
    # the y axis is each plan's peak, in the axis' unit
    peaks = np.array([p.peak_memory_bytes for p in tiny.plans])
    assert xy[:, 1] / xy[0, 1] == pytest.approx(peaks / peaks[0], rel=1e-9)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("fastest within budget" in t for t in labels)
    for name in tiny.reference:
        assert any(t.startswith(name) for t in labels)


def test_frontier_method_uses_the_plot(tiny, tmp_path):
    ax = tiny.plot(memory_budget=tiny.plans[len(tiny.plans) // 2].peak_memory_bytes)
    _png(ax, tmp_path)
    chosen = tiny.best(memory_budget=tiny.plans[len(tiny.plans) // 2].peak_memory_bytes)
    labels = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert chosen.summary in labels


def test_frontier_plot_says_when_no_plan_fits(tiny, tmp_path):
    budget = tiny.min_memory().peak_memory_bytes / 2
    ax = plots.plot_frontier(tiny, memory_budget=budget)
    _png(ax, tmp_path)
    assert any("no plan fits" in t.get_text() for t in ax.texts)


def test_frontiers_overlay(tiny, tiny_8, tmp_path):
    ax = plots.plot_frontiers([tiny, tiny_8], labels=["4 GPUs", "8 GPUs"], memory_budget="1GiB",
                              references=True)
    _png(ax, tmp_path)
    curves = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("frontier-")]
    assert [len(c.get_xydata()) for c in curves] == [len(tiny), len(tiny_8)]
    labels = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "4 GPUs" in labels and "8 GPUs" in labels
    per_sample = plots.plot_frontiers([tiny, tiny_8], per_sample=True)
    assert "per training sample" in per_sample.get_xlabel()


def test_frontiers_default_labels_say_what_differs(tiny, tiny_8):
    ax = plots.plot_frontiers([tiny, tiny_8])
    labels = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "4xA100-80GB" in labels and "8xA100-80GB" in labels
    with pytest.raises(ValueError):
        plots.plot_frontiers([tiny, tiny_8], labels=["one"])


@pytest.mark.parametrize("blocks", ["collapse", "per-block", "first", "all"])
def test_strategy_map(tiny_8, tmp_path, blocks):
    ax = plots.plot_strategy_map(tiny_8, max_plans=12, blocks=blocks, only_changing=False)
    _png(ax, tmp_path)
    img = ax.get_images()[0].get_array()
    assert img.shape[1] == min(12, len(tiny_8))
    table = plots.strategy_table([tiny_8.plans[i] for i in plots.style.spread(len(tiny_8), 12)], blocks=blocks)
    assert img.shape[0] >= len(table)
    names = [t.get_text() for t in ax.get_yticklabels()]
    n_ops = len(tiny_8.plans[0].ops)
    if blocks == "all":
        assert len(table) == n_ops
    else:
        assert len(table) < n_ops          # blocks folded or dropped
        assert not any(n.startswith("layers.1.") for n in names)


def test_strategy_table_marks_disagreeing_blocks(tiny_8):
    table = plots.strategy_table(tiny_8, blocks="collapse")
    plan = tiny_8.plans[0]
    for key, row in table.iterrows():
        if not key.startswith("layers.*"):
            assert row[0] == plan.op(key).config
    changing = plots.strategy_table(tiny_8, only_changing=True)
    assert all(changing.drop(columns="family").nunique(axis=1) > 1)


def test_memory_breakdown(tiny, tmp_path):
    sample = plots.sample_plans(tiny, n=4)
    assert list(sample.values())[0] is tiny.min_time()
    assert tiny.min_memory() in sample.values()
    ax = plots.plot_memory_breakdown(tiny, n=4, memory_budget="40GB")
    _png(ax, tmp_path)
    n_bars = len(sample)
    heights = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0) + patch.get_height()
    assert len(heights) == n_bars
    scale = 2**20 if max(p.peak_memory_bytes for p in sample.values()) < 0.1 * 2**30 else 2**30
    for i, p in enumerate(sample.values()):
        # the bars stack to the step's peak: state, activations, the backward's rise, the batch
        assert heights[i] == pytest.approx(p.peak_memory_bytes / scale, rel=1e-6)
    assert "peak memory per device" in ax.get_ylabel()


def test_memory_breakdown_of_chosen_plans(tiny, tmp_path):
    plans = {"fastest": tiny.min_time(), "leanest": tiny.min_memory()}
    ax = plots.plot_memory_breakdown(plans)
    _png(ax, tmp_path)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fastest", "leanest"]
    ax = plots.plot_memory_breakdown([tiny.min_time()])
    _png(ax, tmp_path, "one.png")


def test_time_breakdown(tiny, tmp_path):
    ax = plots.plot_time_breakdown(tiny, n=3, references=False)
    _png(ax, tmp_path)
    assert "time per training iteration" in ax.get_ylabel()
    assert len(ax.get_xticklabels()) == len(plots.sample_plans(tiny, n=3, references=False))


def test_draws_into_given_axes(tiny):
    fig, axes = plt.subplots(1, 2)
    assert plots.plot_frontier(tiny, ax=axes[0]) is axes[0]
    assert plots.plot_memory_breakdown(tiny, ax=axes[1]) is axes[1]

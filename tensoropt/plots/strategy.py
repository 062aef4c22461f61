"""How each operator is parallelised along a frontier: :func:`strategy_table` (a DataFrame)
and :func:`plot_strategy_map` (operators × plans, coloured by configuration)."""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from .style import mem_scale, pyplot, spread, time_scale

__all__ = ["strategy_table", "plot_strategy_map"]

_LABEL_COLOURS = {
    "b": "#4C78A8",   # batch: data parallel
    "n": "#F58518",   # output features / heads: column-wise tensor parallel
    "k": "#54A24B",   # contracted dim: row-wise tensor parallel (partial sums)
    "h": "#B279A2",   # hidden
    "c": "#9D755D",   # input channels
    "o": "#E45756",   # output channels
    "s": "#72B7B2",   # sequence / spatial
    "v": "#EECA3B",   # vocabulary
}


_EXTRA_COLOURS = ["#FF9DA6", "#BAB0AC", "#2E86AB", "#A23B72", "#F18F01", "#C73E1D", "#3B1F2B",
                  "#6A994E", "#BC4749", "#386641", "#7F5539", "#5E548E", "#9F86C0", "#E09F3E",
                  "#335C67", "#99582A", "#540B0E", "#0081A7", "#F07167", "#00AFB9"]


_REPLICATED = "#E6E6E6"


_LEGEND_NOTE = ("one letter per mesh axis: the dimension split over it\n"
                "b batch (data parallel) · n output features/heads · k contracted dim\n"
                "(tensor parallel) · h hidden · c/o in/out channels · s sequence/spatial\n"
                "- replicated")


_BLOCK = re.compile(r"^layers\.(\d+)([.:].*)$")


_BLOCK_MODES = ("collapse", "per-block", "first", "all")


def _row_key(name: str, blocks: str) -> tuple[str, int | None]:
    m = _BLOCK.match(name)
    if m is None:
        return name, None
    if blocks == "collapse":
        return "layers.*" + m.group(2), int(m.group(1))
    if blocks == "per-block":
        return f"layers.{m.group(1)}", int(m.group(1))
    return name, int(m.group(1))


def strategy_table(frontier_or_plans, blocks: str = "collapse", only_changing: bool = False,
                   families: Sequence[str] | None = None):
    """Per operator (rows) and plan (columns) the configuration string, as a pandas DataFrame.

    ``blocks="collapse"``: operators of repeated blocks ``layers.<i>...`` share one row
    ``layers.*...``; a cell holds the configuration when every block agrees, else the most
    common one followed by ``*`` (e.g. ``"b*"``). ``blocks="per-block"``: one row per block
    ``layers.<i>`` holding the most common configuration of its operators (``*`` when they
    differ): compact for deep networks. ``blocks="first"``: only block 0 is shown;
    ``"all"``: every operator. ``only_changing``: drop rows that never change along the
    frontier. ``families``: keep only these operator families (e.g. ``("linear", "attention")``)."""
    import collections

    import pandas as pd

    plans = list(getattr(frontier_or_plans, "plans", frontier_or_plans))
    if blocks not in _BLOCK_MODES:
        raise ValueError(f"blocks must be one of {', '.join(map(repr, _BLOCK_MODES))}, got {blocks!r}")
    order: list[str] = []
    fam: dict[str, str] = {}
    columns = []
    for p in plans:
        cells: dict[str, collections.Counter] = {}
        for o in p.ops:
            if families is not None and o.family not in families:
                continue
            key, block = _row_key(o.name, blocks)
            if blocks == "first" and block not in (None, 0):
                continue
            if key not in fam:
                fam[key] = "block" if blocks == "per-block" and block is not None else o.family
                order.append(key)
            cells.setdefault(key, collections.Counter())[o.config] += 1
        col = {}
        for key, counter in cells.items():
            (top, n), = counter.most_common(1)
            col[key] = top if n == sum(counter.values()) else top + "*"
        columns.append(col)
    df = pd.DataFrame(columns, columns=order).T
    df.columns = list(range(len(plans)))
    if only_changing and len(df.columns) > 1:
        df = df[df.nunique(axis=1) > 1]
    df.insert(0, "family", [fam[k] for k in df.index])
    return df


def _blend(colour: str, towards_white: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (r + (1 - r) * towards_white, g + (1 - g) * towards_white, b + (1 - b) * towards_white)


def _config_colours(configs: Iterable[str]) -> dict[str, Any]:
    """A colour per configuration string: the split label's own colour (b blue, n orange,
    k green, ...), lighter when some mesh axes replicate (``"n,-"`` lighter than ``"n,n"``);
    grey when replicated everywhere; other colours for mixed splits (``"b,n"``)."""
    import collections

    counts = collections.Counter(configs)
    out, extra = {}, iter(_EXTRA_COLOURS * 4)

    def sort_key(cfg):
        letters = cfg.split(",")
        split = sorted({s for s in letters if s != "-"})
        return (len(split) != 1, "".join(split), letters.count("-"), cfg)

    for cfg in sorted(counts, key=sort_key):
        letters = cfg.split(",")
        split = {s for s in letters if s != "-"}
        if not split:
            out[cfg] = _REPLICATED
        elif len(split) == 1 and next(iter(split)) in _LABEL_COLOURS:
            out[cfg] = _blend(_LABEL_COLOURS[next(iter(split))], 0.5 * letters.count("-") / len(letters))
        else:
            out[cfg] = next(extra)
    return out


def plot_strategy_map(frontier, ax=None, max_plans: int = 24, blocks: str = "collapse",
                      only_changing: bool = True, families: Sequence[str] | None = None,
                      cell_text: bool | None = None, title: str | None = None):
    """How each operator is parallelised along the frontier: operators (rows) × plans
    (columns, fastest on the left to least memory on the right), each cell coloured by the
    operator's configuration (the label split over each mesh axis; grey = replicated).

    Readable with many operators: repeated blocks ``layers.<i>`` fold into one row per
    block operator (``blocks="collapse"``; a hatched cell with ``*`` means the blocks
    disagree and shows the most common configuration), ``blocks="per-block"`` gives one row
    per block (its operators' most common configuration), ``blocks="first"`` shows block 0
    only, and ``only_changing`` keeps the rows whose configuration changes along the
    frontier. At most ``max_plans`` columns, spread evenly over the frontier. Rows on top
    give the mesh, the ZeRO stage and how many blocks recompute their activations."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch, Rectangle

    plans = list(frontier.plans)
    if not plans:
        raise ValueError("empty frontier: nothing to plot")
    cols = spread(len(plans), max_plans)
    sel = [plans[i] for i in cols]
    table = strategy_table(sel, blocks=blocks, only_changing=only_changing, families=families)
    configs = table.drop(columns="family")
    # meta rows: what changes besides operator configurations
    meta: list[tuple[str, list[str]]] = []
    meshes = [p.mesh for p in sel]
    if len(set(meshes)) > 1:
        meta.append(("mesh", meshes))
    zs = [getattr(p, "zero_stage", 0) for p in sel]
    if any(zs):
        meta.append(("ZeRO stage", [f"Z{z}" if z else "-" for z in zs]))
    rc = [len(getattr(p, "recompute", ()) or ()) for p in sel]
    if any(rc):
        meta.append(("recomputed blocks", [str(r) if r else "-" for r in rc]))

    n_rows, n_cols = len(meta) + len(configs), len(sel)
    if ax is None:
        plt = pyplot()
        w = min(max(7.0, 3.2 + 0.42 * n_cols), 16.0)
        h = min(max(3.5, 1.9 + 0.24 * n_rows), 22.0)
        _, ax = plt.subplots(figsize=(w, h), layout="constrained")
    raw = [str(v).rstrip("*") for v in configs.to_numpy().ravel() if isinstance(v, str)]
    colours = _config_colours(raw)
    img = np.ones((n_rows, n_cols, 3))
    greys = {}
    for r, (_, vals) in enumerate(meta):
        uniq = sorted(set(vals), key=lambda v: (v != "-", len(v), v))
        for j, v in enumerate(vals):
            g = 0.97 - 0.45 * uniq.index(v) / max(len(uniq) - 1, 1) if v != "-" else 1.0
            greys[(r, j)] = g
            img[r, j] = (g, g, g)
    mixed = []
    for i, (key, row) in enumerate(configs.iterrows()):
        r = len(meta) + i
        for j, v in enumerate(row.tolist()):
            if not isinstance(v, str):
                continue              # operator absent from this plan
            img[r, j] = to_rgb(colours[v.rstrip("*")])
            if v.endswith("*"):
                mixed.append((r, j))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    for r, j in mixed:
        ax.add_patch(Rectangle((j - 0.5, r - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white", linewidth=0))
    # grid lines between cells
    ax.set_xticks(np.arange(-0.5, n_cols, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_rows, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    if meta:
        ax.axhline(len(meta) - 0.5, color="black", linewidth=1.5)
    show_text = cell_text if cell_text is not None else (n_cols <= 30 and n_rows <= 60)
    if show_text:
        fs = 7 if n_cols > 16 else 8
        for r, (_, vals) in enumerate(meta):
            for j, v in enumerate(vals):
                ax.text(j, r, v, ha="center", va="center", fontsize=fs - 1, color="black")
        for i, (key, row) in enumerate(configs.iterrows()):
            for j, v in enumerate(row.tolist()):
                if isinstance(v, str):
                    rgb = to_rgb(colours[v.rstrip("*")])
                    dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.55
                    ax.text(j, len(meta) + i, v, ha="center", va="center", fontsize=fs,
                            color="white" if dark else "black")
    ylabels = [m for m, _ in meta] + [f"{k}  ({f})" for k, f in zip(configs.index, table["family"])]
    ax.set_yticks(range(n_rows))
    ax.set_yticklabels(ylabels, fontsize=8 if n_rows <= 40 else 6)
    scale, unit = time_scale([p.time_s for p in sel])
    mscale, munit = mem_scale([p.peak_memory_bytes for p in sel])
    ax.set_xticks(range(n_cols))
    ax.set_xticklabels([f"{p.time_s * scale:.3g} {unit}\n{p.peak_memory_bytes * mscale:.3g} {munit}" for p in sel],
                       fontsize=7, rotation=90)
    ax.set_xlabel(f"frontier plans ({len(sel)} of {len(plans)}): fastest on the left → least memory on the right",
                  fontsize=9)
    handles = [Patch(facecolor=c, edgecolor="gray", label=cfg) for cfg, c in colours.items()]
    if mixed:
        differ = "operators of the block differ" if blocks == "per-block" else "blocks differ"
        handles.append(Patch(facecolor="white", edgecolor="gray", hatch="///",
                             label=f"* {differ}\n(most common shown)"))
    ax.legend(handles=handles, title="configuration", loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=8, title_fontsize=9, frameon=False, ncol=1 if len(handles) <= 24 else 2)
    ax.annotate(_LEGEND_NOTE, (1.01, 0), xycoords="axes fraction", fontsize=7, va="bottom", color="dimgray")
    if not len(configs):
        ax.text(n_cols / 2 - 0.5, max(n_rows - 1, 0) / 2, "no operator changes configuration along the frontier",
                ha="center", va="center", fontsize=10)
    what = "operators that change" if only_changing else "operators"
    ax.set_title(title or f"{frontier.model} on {frontier.devices}: configuration of the {what} along the "
                 f"frontier", fontsize=11)
    return ax

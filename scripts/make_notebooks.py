"""Write notebooks/*.ipynb from the cell sources below (outputs empty), so the notebooks
stay reviewable as plain Python: edit here, run ``python scripts/make_notebooks.py``,
commit both. ``--check`` exits 1 when a notebook differs from what this script writes.

The notebooks use the public API only (``tensoropt.frontier``, ``Frontier``, ``Plan``,
``tensoropt.plots``, the model zoo) and end with a cell that checks their key facts;
``tests/test_notebooks.py`` executes them top to bottom.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks"

SETUP = """\
import time
import warnings

import matplotlib.pyplot as plt
import pandas as pd

import tensoropt
from tensoropt import plots
from tensoropt.units import parse_bytes

warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm without ipywidgets
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 20)
%matplotlib inline"""

COLUMNS = '["time_ms", "memory_gib", "forward_end_gib", "mesh", "summary", "fits_device"]'


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


# ------------------------------------------------------------------------------ 01 quickstart

QUICKSTART = [
    md("""
# Quickstart: the time/memory frontier of one model

`tensoropt.frontier(model, devices)` searches every way of splitting each operator of a
model over a mesh of devices (data, tensor and sequence parallelism, ZeRO, activation
recomputation) and returns the **Pareto frontier**: the plans for which no other plan is
both faster per training iteration and smaller in peak memory per device.

This notebook: one model on one set of devices → the frontier as a table and a curve →
pick the fastest plan that fits a memory budget → read it → save it as JSON.

**Settings for a quick run.** The cell below uses GPT-2 (124M) with batch 8 on 8 A100s and
only 1-D device meshes (`MAX_MESH_DIMS = 1`), which takes seconds on a laptop CPU. For the
full analysis raise `MAX_MESH_DIMS` to 2 or 3 (2-D/3-D meshes combine data and tensor
parallelism; the search is then minutes), try `MODEL = "gpt2-xl"` or `"llama3-8b"`, and a
budget such as `"40GB"`.
"""),
    code(SETUP),
    code("""
MODEL = "gpt2"             # a zoo name (tensoropt.models.MODEL_NAMES) or an nn.Module with inputs=
DEVICES = "8xA100-80GB"    # "<count>x<device>", e.g. "4x8xH100" for 4 nodes of 8
BATCH_SIZE = 8             # global batch (sequences of 1024 tokens for GPT-2)
MAX_MESH_DIMS = 1          # 2 or 3 for the full search (slower)
MEMORY_BUDGET = "0.6GiB"   # per device; GiB = 2**30 bytes, GB = 10**9 bytes
PLAN_PATH = "gpt2_plan.json"
"""),
    md("## 1. Search the frontier"),
    code("""
start = time.perf_counter()
f = tensoropt.frontier(MODEL, DEVICES, batch_size=BATCH_SIZE, max_mesh_dims=MAX_MESH_DIMS, progress=False)
print(f"searched in {time.perf_counter() - start:.1f} s")
f
"""),
    md("""
Each row is one Pareto-optimal plan, fastest first. `summary` names the role of each mesh
axis (`dp8` data parallel over 8 devices, `tp` tensor parallel, `dp~` mostly data parallel,
`zero2`/`zero3` ZeRO stage, `rc4/12` recomputes the activations of 4 of the 12 blocks);
the remaining columns split the time (seconds) and memory (bytes) by kind.
"""),
    code(f"""
table = f.to_pandas()
table[{COLUMNS}].iloc[:: max(len(table) // 12, 1)]
"""),
    md("""
The reference plans are priced by the same cost model: plain data parallelism (every
device holds the whole model and its optimizer state) and Megatron-style tensor parallelism.
They are usually *off* the frontier: a searched plan is faster at the same memory, or smaller
at the same speed.
"""),
    code(f"f.references_to_pandas()[[\"label\"] + {COLUMNS}]"),
    md("""
## 2. The trade-off curve

The staircase is the frontier. The box in the lower left answers *what does memory buy?*:
how much per-device memory the leanest plan saves against the fastest and what that costs
in time per iteration; the top axis reads the slowdown against the fastest plan. The dashed
line is the memory budget, the star the fastest plan under it.
"""),
    code("""
ax = f.plot(memory_budget=MEMORY_BUDGET)
plt.show()
"""),
    md("## 3. Choose a plan by memory budget"),
    code("""
plan = f.best(memory_budget=MEMORY_BUDGET)
print(plan)
print(f"budget {parse_bytes(MEMORY_BUDGET) / 2**30:.3f} GiB, plan {plan.memory_bytes / 2**30:.3f} GiB per device "
      f"at the end of forward, {plan.peak_memory_bytes / 2**30:.3f} GiB at its peak in backward")
"""),
    md("""
`describe()` lists every operator: its configuration (per mesh axis the dimension split
over it: `b` batch, `n` output features, `k` the contracted dimension, `h` hidden, `-`
replicated), the layout of its output in DTensor terms (`S(d)` sharded on dim d, `R`
replicated, `P` partial sums), and its share of time and memory.
"""),
    code("print(plan.describe(max_rows=30))"),
    md("""
Where the memory goes, for a few plans along the frontier and the reference plans (the
time per iteration is written above each bar):
"""),
    code("""
ax = plots.plot_memory_breakdown(f, n=4, memory_budget=MEMORY_BUDGET)
plt.show()
"""),
    md("""
A budget below the frontier's least memory has no plan; the error says what the minimum is:
"""),
    code("""
try:
    f.best(memory_budget="100MB")
except tensoropt.InfeasibleBudget as err:
    print("InfeasibleBudget:", err)
"""),
    md("""
## 4. Save the plan

The JSON file holds the mesh, every operator's configuration and placements, and the
predicted costs; `tensoropt.parallelize(model, plan)` applies it under `torchrun`.
"""),
    code("""
plan.save(PLAN_PATH)
loaded = tensoropt.Plan.load(PLAN_PATH)
print(f"saved {PLAN_PATH}: {len(loaded.ops)} operators, mesh {loaded.mesh}, identical: {loaded == plan}")
"""),
    md("## Checks\nThe facts this notebook relies on (the test suite runs this notebook and reads this line)."),
    code("""
budget = parse_bytes(MEMORY_BUDGET)
assert plan.memory_bytes <= plan.peak_memory_bytes <= budget                         # it fits at its peak
assert all(p.peak_memory_bytes > budget for p in f.plans if p.time_s < plan.time_s)  # nothing faster fits
assert loaded == plan
print(f"CHECK quickstart plans={len(f)} budget_bytes={budget} plan_memory_bytes={plan.memory_bytes!r} "
      f"plan_time_s={plan.time_s!r}")
"""),
]


# ------------------------------------------------------------------------------ 02 vision

VISION = [
    md("""
# Vision models: ResNet-50, WideResNet-50-2, VGG-16

Convolutional networks are the opposite of language models in where their memory goes:
few parameters against large activations (the feature maps saved for backward). This
notebook compares their frontiers, looks at what is in their memory, and at which layers
leave data parallelism along the frontier.

**Settings for a quick run:** global batch 64 (the ImageNet papers use 256) on 8 A100s with
1-D meshes (`MAX_MESH_DIMS = 1`); each search takes seconds. For the full analysis set
`BATCH_SIZE = 256`, `MAX_MESH_DIMS = 2` (or 3) and add device counts to `DEVICE_COUNTS`.
"""),
    code(SETUP),
    code("""
MODELS = ["resnet50", "wide_resnet50_2", "vgg16"]
DEVICE = "A100-80GB"
DEVICES = f"8x{DEVICE}"
BATCH_SIZE = 64
MAX_MESH_DIMS = 1
DEVICE_COUNTS = [2, 8]       # for the scaling comparison of ResNet-50
MEMORY_BUDGET = "1GiB"
"""),
    md("## 1. One frontier per model"),
    code("""
frontiers = {}
for name in MODELS:
    start = time.perf_counter()
    frontiers[name] = tensoropt.frontier(name, DEVICES, batch_size=BATCH_SIZE, max_mesh_dims=MAX_MESH_DIMS,
                                         progress=False)
    print(f"{name:16s} {time.perf_counter() - start:5.1f} s  {frontiers[name]}")
"""),
    code("""
pd.DataFrame([{"model": name,
               "plans": len(f),
               "fastest (ms)": f.min_time().time_s * 1e3,
               "its memory (GiB)": f.min_time().peak_memory_bytes / 2**30,
               "least memory (GiB)": f.min_memory().peak_memory_bytes / 2**30,
               "its time (ms)": f.min_memory().time_s * 1e3,
               "data parallel (ms)": f.reference["data parallel"].time_s * 1e3,
               "data parallel (GiB)": f.reference["data parallel"].peak_memory_bytes / 2**30}
              for name, f in frontiers.items()]).round(3)
"""),
    md("""
The three frontiers on one axes (time per iteration against memory per device; down and
left is better). Each star is the fastest plan of that model under the budget.
"""),
    code("""
ax = plots.plot_frontiers(list(frontiers.values()), labels=MODELS, memory_budget=MEMORY_BUDGET, references=True)
plt.show()
"""),
    md("""
## 2. Where the memory goes

Stacked bars per plan: parameters, gradients, optimizer state (Adam: two fp32 moments and,
with bf16 mixed precision, an fp32 master copy) and the activations saved for backward.
For each model the fastest and the leanest frontier plan and plain data parallelism.
"""),
    code("""
fig, axes = plt.subplots(1, len(MODELS), figsize=(15, 4.8), layout="constrained", sharey=True)
for ax, (name, f) in zip(axes, frontiers.items()):
    plots.plot_memory_breakdown({"fastest": f.min_time(), "least memory": f.min_memory(),
                                 "data parallel": f.reference["data parallel"]},
                                ax=ax, memory_budget=MEMORY_BUDGET, title=name)
plt.show()
"""),
    md("""
Activations dominate the CNNs at this batch size, so the frontier trades time for memory
mostly by **recomputing** the activations of blocks in backward (the `rc` in the plan
summaries) and by **ZeRO** (sharding optimizer state and gradients across the data-parallel
devices), rather than by splitting weights. VGG-16 is the exception among the three: its
fully connected layers hold most of its 138M parameters.

## 3. Which layers change configuration along the frontier

Columns are frontier plans from the fastest (left) to the leanest (right); rows are
operators whose configuration changes (`b`: the batch is split, i.e. data parallel; `c`/`o`:
input/output channels split, i.e. tensor parallel; `k`/`n`: a linear layer split along its
input/output features; grey: replicated). For ResNets each row is one residual block
(`layers.<i>`) with the most common configuration of its operators.
"""),
    code("""
ax = plots.plot_strategy_map(frontiers["resnet50"], blocks="per-block", max_plans=20)
plt.show()
"""),
    code("""
ax = plots.plot_strategy_map(frontiers["vgg16"], max_plans=20)
plt.show()
"""),
    md("""
Reading the maps: the operators that leave plain batch splitting toward the lean end are
the ones with the most parameters per activation byte — the last (widest) residual stages
and the classifier of ResNet-50, the fully connected layers of VGG-16 — because splitting
their weights saves weight, gradient and optimizer memory for little extra communication,
while the early, activation-heavy layers stay data parallel.

## 4. More devices

ResNet-50 on 2 and 8 devices at the same global batch: more devices cut both the time per
iteration and the memory per device (each holds fewer samples' activations).
"""),
    code("""
scaling = {n: tensoropt.frontier("resnet50", f"{n}x{DEVICE}", batch_size=BATCH_SIZE, max_mesh_dims=MAX_MESH_DIMS,
                                 progress=False)
           for n in DEVICE_COUNTS}
ax = plots.plot_frontiers(list(scaling.values()), labels=[f"{n} devices" for n in DEVICE_COUNTS],
                          memory_budget=MEMORY_BUDGET)
plt.show()
"""),
    md("## Checks"),
    code("""
budget = parse_bytes(MEMORY_BUDGET)
for name, f in frontiers.items():
    times, mems = f.times_s, f.memories_bytes
    assert (times[1:] >= times[:-1]).all() and (mems[1:] < mems[:-1]).all(), name   # a Pareto staircase
    dp = f.reference["data parallel"]
    # data parallelism is in the search space: it cannot beat a frontier plan on both counts
    assert not any(dp.time_s < p.time_s and dp.peak_memory_bytes < p.peak_memory_bytes for p in f.plans), name
    assert f.min_memory().peak_memory_bytes <= dp.peak_memory_bytes, name
small, large = scaling[min(DEVICE_COUNTS)], scaling[max(DEVICE_COUNTS)]
assert large.min_time().time_s < small.min_time().time_s
assert large.min_memory().peak_memory_bytes < small.min_memory().peak_memory_bytes
chosen = {name: f.best(memory_budget=MEMORY_BUDGET) for name, f in frontiers.items()}
assert all(p.peak_memory_bytes <= budget for p in chosen.values())
print("CHECK vision " + " ".join(f"{name}={p.peak_memory_bytes!r}" for name, p in chosen.items())
      + f" budget_bytes={budget}")
"""),
]


# ------------------------------------------------------------------------------ 03 language

LANGUAGE = [
    md("""
# Language models: how the frontier moves with devices and batch size

GPT-2 for the sweeps, tiny BERT/LLaMA variants on 2-D meshes, then BERT-large, LLaMA-3-8B
and GPT-3 175B on 1024 GPUs. Three questions: how the frontier moves with the
**device count** and the **batch size**; **where data parallelism stops fitting** (every
device holding the whole model and its optimizer state); and **which operators change
configuration** along the frontier, and why.

**Settings for a quick run** (one and a half to two minutes on a shared 2-core CPU, three
quarters of it the three large searches of section 5): GPT-2 small, 1-D device meshes
(`MAX_MESH_DIMS = 1`), two device counts and two batch sizes, one tiny model on 2-D meshes;
the large models with the settings of section 5. For the full analysis of sections 1-4 set
`MAX_MESH_DIMS = 2` or `3` (data × tensor parallel meshes), `DEVICE_COUNTS = [2, 4, 8, 16]`
and `BATCH_SIZES = [8, 16, 32, 64]`; `RUN_LARGE = False` skips section 5.
"""),
    code(SETUP + "\nfrom tensoropt.models import example_inputs, get_model"),
    code("""
DEVICE = "A100-80GB"
SWEEP_MODEL = "gpt2"
DEVICE_COUNTS = [2, 8]
BATCH_SIZES = [8, 32]
MAX_MESH_DIMS = 1
TINY_2D = "bert-tiny"        # a model small enough to search on 2-D meshes in seconds
MEMORY_BUDGET = "1GiB"       # per device
# section 5, large models (seconds to tens of seconds per search here; see there)
RUN_LARGE = True
LARGE_EPSILON = 0.01         # (1+ε)-approximate frontiers (memory within 1 %, see section 5)
LARGE_MESH_DIMS = 1          # BERT-large and LLaMA-3-8B on 8 devices (pipeline stages come on top)
LLAMA_SEQ_LEN = 2048
GPT3_NODES, GPT3_PER_NODE = 128, 8   # 1024 GPUs: above 64 devices the coarse plan space
GPT3_BATCH = 1024            # sequences of 2048 tokens: 2.1M tokens per iteration
GPT3_MESH_DIMS = 2
"""),
    md("""
## 1. More devices

GPT-2 at a global batch of 8 sequences of 1024 tokens on each device count. Each extra
device takes a share of the batch (less activation memory and compute per device) and of
the sharded state. Crosses: plain data parallelism; stars: the fastest plan of each device
count under the budget.
"""),
    code("""
by_devices = {}
for n in DEVICE_COUNTS:
    start = time.perf_counter()
    by_devices[n] = tensoropt.frontier(SWEEP_MODEL, f"{n}x{DEVICE}", batch_size=8, max_mesh_dims=MAX_MESH_DIMS,
                                       progress=False)
    print(f"{n} devices: {time.perf_counter() - start:4.1f} s  {by_devices[n]}")
ax = plots.plot_frontiers(list(by_devices.values()), labels=[f"{n} devices" for n in DEVICE_COUNTS],
                          memory_budget=MEMORY_BUDGET, references=True)
plt.show()
"""),
    md("""
## 2. Larger batches

GPT-2 on the largest device count at each global batch. The x axis is the time **per
sample** (iteration time / batch), so the curves compare throughput: larger batches use the
devices better but need more activation memory per device.
"""),
    code("""
n_max = max(DEVICE_COUNTS)
by_batch = {b: by_devices[n_max] if b == 8 else
               tensoropt.frontier(SWEEP_MODEL, f"{n_max}x{DEVICE}", batch_size=b, max_mesh_dims=MAX_MESH_DIMS,
                                  progress=False)
            for b in BATCH_SIZES}
ax = plots.plot_frontiers(list(by_batch.values()), labels=[f"batch {b}" for b in BATCH_SIZES], per_sample=True,
                          references=True)
plt.show()
"""),
    md("""
## 3. Where data parallelism stops fitting

Plain data parallelism keeps on every device the bf16 weights and gradients, the fp32
master weights and the two Adam moments (about 16 bytes per parameter) plus its share of
the activations. More devices shrink only the activation share, so its memory per device
barely moves, while the frontier's least-memory plan (ZeRO sharding of optimizer state and
gradients, tensor parallelism, recomputation) shrinks with every device added. Against the
budget:
"""),
    code("""
budget = parse_bytes(MEMORY_BUDGET)
rows = []
for label, f in [(f"{n} devices, batch 8", by_devices[n]) for n in DEVICE_COUNTS] + \
                [(f"{n_max} devices, batch {b}", by_batch[b]) for b in BATCH_SIZES if b != 8]:
    dp = f.reference["data parallel"]
    rows.append({"setting": label,
                 "data parallel GiB": dp.peak_memory_bytes / 2**30,
                 "data parallel fits": dp.peak_memory_bytes <= budget,
                 "frontier least GiB": f.min_memory().peak_memory_bytes / 2**30,
                 "a plan fits": f.min_memory().peak_memory_bytes <= budget})
pd.DataFrame(rows).round(3)
"""),
    md("""
On the largest device count at batch 8, data parallelism misses the budget; the fastest
plan that fits, next to it and the frontier's extremes:
"""),
    code("""
f8 = by_devices[n_max]
plan = f8.best(memory_budget=MEMORY_BUDGET)
print(plan)
ax = plots.plot_memory_breakdown({"data parallel": f8.reference["data parallel"], "fastest": f8.min_time(),
                                  "fastest within budget": plan, "least memory": f8.min_memory()},
                                 memory_budget=MEMORY_BUDGET)
plt.show()
"""),
    md("""
## 4. Which operators change configuration along the frontier, and why

GPT-2 on the largest device count, one row per block operator (`layers.*`: the 12
transformer blocks folded; hatched `*` cells: the blocks do not all agree, the most common
configuration is shown), columns from the fastest plan (left) to the leanest (right).
"""),
    code("""
ax = plots.plot_strategy_map(by_devices[n_max], max_plans=20)
plt.show()
"""),
    md("""
How to read it: the fastest plans split every operator's batch (`b`: data parallel; the
top rows give the ZeRO stage, which shards optimizer state and gradients over the
data-parallel devices). Moving right, memory is bought back first by **recomputing** blocks
(the count of the 12 blocks whose activations are recomputed in backward: one extra forward
each, no communication). Operators that leave the batch split are the weight-heavy ones:
the MLP's `fc1` splits its output features (`n`), the GELU its hidden dimension (`h`), `fc2`
its contracted dimension (`k`, partial sums reduced after it) — Megatron's column-then-row
pattern, found by the search rather than prescribed — because the MLP holds two thirds of a
block's weights; the attention projections follow (`q/k/v` split by output features, i.e.
by heads, `o_proj` by its contracted dimension). The exact order of these steps depends on
the cost model and the settings above; rerun with `MAX_MESH_DIMS = 2` to see data and
tensor parallelism combined on one mesh.

The same per-operator table as data (here the fastest plan that fits the budget):
"""),
    code("""
plots.strategy_table([plan], blocks="collapse").rename(columns={0: "config"})
"""),
    md("""
On 2-D meshes each operator chooses what to split over each of the two mesh axes; a
configuration reads per axis, e.g. `b,n` = batch over the first axis (data parallel across
the rows of a 2×4 mesh), output features over the second (tensor parallel within a row).
Shades of one colour are the same split on one or on both axes.
"""),
    code("""
start = time.perf_counter()
tiny = tensoropt.frontier(TINY_2D, f"8x{DEVICE}", batch_size=8, max_mesh_dims=2, progress=False)
print(f"{time.perf_counter() - start:.1f} s: {tiny}; meshes searched: {', '.join(tiny.stats['meshes'])}")
ax = plots.plot_strategy_map(tiny, max_plans=20)
plt.show()
"""),
    md("""
## 5. Large models

A search over these models now takes seconds to tens of seconds on a 2-core CPU. The
settings, and each search's wall time measured with `time` on the shared 2-core machine
this notebook was written on (the range is its load average, 1 to 5 on 2 cores; each cell
prints the time of its own run):

| model | devices | batch × tokens | meshes | ε | search |
|---|---|---|---|---|---|
| BERT-large (335M) | 8 A100-80GB | 8 × 512 | 1-D (+ pipeline) | 0.01 | 9–21 s |
| LLaMA-3-8B | 8 A100-80GB | 8 × 2048 | 1-D (+ pipeline) | 0.01 | 19–47 s (76 s at load 9) |
| GPT-3 175B | 1024 A100-80GB (128 nodes × 8) | 1024 × 2048 | up to 2-D (+ pipeline), coarse space | 0.01 | 30–49 s |

On 8 devices the search covers every assignment on 1-D meshes (`LARGE_MESH_DIMS = 1`;
pipeline plans add a stage axis on top). 2-D meshes cost more there: 21 s for BERT-large,
and LLaMA-3-8B on 2-D meshes had not finished after 200 s, so both stay at 1-D.
`LARGE_EPSILON = 0.01` asks for a (1+ε)-approximate frontier: for every plan of the exact
frontier it returns one at least as fast with at most 1 % more memory, and far fewer plans
to carry through the search.

LLaMA-3-8B at 2048-token sequences is where data parallelism needs more than the 80 GB of
the device (8B parameters × 16 bytes) and the frontier's plans still fit. A zoo model with
another sequence length is passed as a module and its inputs (meta tensors: nothing is
allocated).
"""),
    code("""
large = {}
if RUN_LARGE:
    for name, inputs in [("bert-large", example_inputs("bert-large", 8)),
                         ("llama3-8b", example_inputs("llama3-8b", 8, seq_len=LLAMA_SEQ_LEN))]:
        start = time.perf_counter()
        large[name] = tensoropt.frontier(get_model(name), f"8x{DEVICE}", inputs, max_mesh_dims=LARGE_MESH_DIMS,
                                         epsilon=LARGE_EPSILON, progress=False)
        print(f"{name}: {time.perf_counter() - start:.1f} s  {large[name]}")
    fig, axes = plt.subplots(1, 2, figsize=(18, 6.5))
    for ax, (name, f) in zip(axes, large.items()):
        plots.plot_frontier(f, ax=ax, label=name, title=f"{name} on 8x{DEVICE}, batch 8")
    plt.show()
else:
    print("skipped: set RUN_LARGE = True")
"""),
    code("""
pd.DataFrame([{"model": name, "data parallel GiB": f.reference["data parallel"].peak_memory_bytes / 2**30,
               "data parallel fits": f.reference["data parallel"].peak_memory_bytes <= f.device_memory_bytes,
               "fastest plan": f.min_time().summary, "fastest GiB": f.min_time().peak_memory_bytes / 2**30,
               "least-memory plan": f.min_memory().summary, "least GiB": f.min_memory().peak_memory_bytes / 2**30}
              for name, f in large.items()]).round(2)
"""),
    md("""
BERT-large fits by plain data parallelism. LLaMA-3-8B does not: data parallelism needs
more than the device. The frontier's fastest plan does not fit either (at the time of
writing the batch split over the 8 devices, with a few operators in other layouts, and
every device holding the whole optimizer state), but a plan within 1 % of its time does,
with room to spare: the same with ZeRO-2 (gradients and optimizer state sharded, about
40 GiB), whose collectives the DTensor runner issues one parameter at a time. Down each frontier, memory is bought back with ZeRO-3, recomputation and, for
LLaMA-3-8B, pipeline stages with tensor parallelism inside each; the table names each
frontier's two ends.

### GPT-3 175B on 1024 GPUs

Above 64 devices `tensoropt.frontier` searches a **coarse plan space** by default: only the
outermost mesh axis crosses nodes and on it operators only split the batch or replicate
(data parallelism and ZeRO over the network, pipeline stages cut from that axis), every
other axis stays inside a node (tensor parallelism on the intra-node links), and the 96
blocks are tied into 8 groups of consecutive blocks that share one configuration. Every
plan found is priced exactly; the frontier is exact over that restricted space, and
`f.stats["search_space"]` says which space was searched. The batch is 1024 sequences rather
than the paper's 1536 so that data parallelism over all 1024 devices splits it evenly.
"""),
    code("""
gpt3 = None
if RUN_LARGE:
    start = time.perf_counter()
    gpt3 = large["gpt3-175b"] = tensoropt.frontier("gpt3-175b", f"{GPT3_NODES}x{GPT3_PER_NODE}x{DEVICE}",
                                                   batch_size=GPT3_BATCH, max_mesh_dims=GPT3_MESH_DIMS,
                                                   epsilon=LARGE_EPSILON, progress=False)
    print(f"gpt3-175b: {time.perf_counter() - start:.1f} s  {gpt3}")
    print("search space:", gpt3.stats["search_space"])
    print("meshes searched:", ", ".join(gpt3.stats["meshes"]))
    fast = gpt3.min_time()
    print(f"fastest plan: {fast.summary}; mesh {fast.mesh_shape} over links {fast.mesh_links}; "
          f"pipeline degree {fast.mesh_shape[0] if fast.stages else 1} (mesh axis 0 of a pipeline plan), "
          f"{fast.microbatches} micro-batches, ZeRO stage {fast.zero_stage}")
    print(fast)
    plots.plot_frontier(gpt3)
    plt.show()
else:
    print("skipped: set RUN_LARGE = True")
"""),
    md("""
The reference plans (data parallelism and Megatron-style data × tensor parallelism) are all
off the chart: data parallelism keeps the whole 175B-parameter model with its gradients and
Adam state (about 2.8 TB) on every device, and even 8-way tensor parallelism leaves hundreds
of GiB per device. The fastest frontier plans hold more than a device's 80 GB (the
`fits_device` column says which): GPT-2's vocabulary of 50,257 words makes the LM head a
misaligned matrix multiply, slow on the matrix units, and the last pipeline stage that
holds it sets the pace, so the fastest plans take few, long stages. At the time of writing
the fastest is `pp4·dp32·tp8 mb16` (111 GiB); the fastest that fits, `gpt3.best()`, is
`pp8·dp16·tp8 mb32` with recomputation: 8 pipeline stages of 12 blocks, 16-way data
parallelism (both over the inter-node network), 8-way tensor parallelism inside a node, and
32 micro-batches per iteration to keep the pipeline bubble small. Down the frontier, memory
is bought back with more stages and recomputation; at the bottom ZeRO-3 with every block
recomputed holds under 10 GiB per device at about twice the iteration time.
"""),
    code("""
gpt3.references_to_pandas()[["label", "time_ms", "memory_gib", "mesh", "summary", "fits_device"]].round(1) \\
    if gpt3 is not None else None
"""),
    md("## Checks"),
    code("""
lo, hi = min(DEVICE_COUNTS), max(DEVICE_COUNTS)
assert by_devices[hi].min_time().time_s < by_devices[lo].min_time().time_s                 # faster
assert by_devices[hi].min_memory().peak_memory_bytes < by_devices[lo].min_memory().peak_memory_bytes  # and leaner
assert by_batch[max(BATCH_SIZES)].min_memory().peak_memory_bytes > by_batch[min(BATCH_SIZES)].min_memory().peak_memory_bytes
dp = f8.reference["data parallel"]
assert dp.peak_memory_bytes > budget >= plan.peak_memory_bytes   # data parallelism misses the budget, the plan fits
print(f"CHECK language dp_bytes={dp.peak_memory_bytes!r} budget_bytes={budget} plan_bytes={plan.peak_memory_bytes!r}")
if RUN_LARGE:
    llama = large["llama3-8b"]
    assert llama.reference["data parallel"].peak_memory_bytes > llama.device_memory_bytes   # DP does not fit
    llama_fits = llama.best()                                                             # a plan that does
    assert llama_fits.peak_memory_bytes <= llama.device_memory_bytes
    assert llama_fits.time_s <= 1.01 * llama.min_time().time_s                            # at about the fastest's time
    assert gpt3.stats["search_space"]["coarse"]
    assert gpt3.reference["data parallel"].peak_memory_bytes > gpt3.device_memory_bytes
    fits = gpt3.best()                                                                    # the fastest that fits
    assert fits.peak_memory_bytes <= gpt3.device_memory_bytes
    assert all(p.peak_memory_bytes > gpt3.device_memory_bytes for p in gpt3 if p.time_s < fits.time_s)
    assert fits.world_size == GPT3_NODES * GPT3_PER_NODE and fits.stages and fits.microbatches > 1
    assert fits.mesh_shape[-1] <= GPT3_PER_NODE                                           # tensor parallel in a node
    print(f"CHECK large device_bytes={gpt3.device_memory_bytes!r} "
          f"llama_dp_bytes={llama.reference['data parallel'].peak_memory_bytes!r} "
          f"llama_plan_bytes={llama_fits.peak_memory_bytes!r} "
          f"gpt3_dp_bytes={gpt3.reference['data parallel'].peak_memory_bytes!r} "
          f"gpt3_plan_bytes={fits.peak_memory_bytes!r} gpt3_mesh={fits.mesh} "
          f"gpt3_pipeline={fits.mesh_shape[0] if fits.stages else 1} gpt3_microbatches={fits.microbatches} "
          f"gpt3_zero={fits.zero_stage} gpt3_coarse={gpt3.stats['search_space']['coarse']} "
          f"gpt3_summary={fits.summary.replace(' ', '_')}")
"""),
]

# ------------------------------------------------------------------------------ 04 budget to training

TRAINING = [
    md("""
# From a memory budget to real training steps

Pick the fastest plan under a memory budget for a small model, then run a few real
training steps of it on this machine's CPU with 2 ranks over gloo (`torchrun`), and put the
prediction next to the measurement. The prediction uses the CPU profile measured by
`tensoropt profile` (`data/profiles/cpu-2core.json`); a second frontier is searched with the cost
terms `scripts/validate.py` fitted on earlier real runs.
"""),
    code(SETUP + """
from tensoropt.hardware import DATA_DIR
from tensoropt.models import example_inputs, get_model
from tensoropt.validate import measure_plans
from tensoropt.validate.cases import MODELS

DATA = DATA_DIR.parent                       # the repository's data/ folder
PROFILE = str(DATA / "profiles" / "cpu-2core.json")
CALIBRATION = str(DATA / "validation" / "step_calibration.json")
name, overrides, batch = MODELS["mlp"]      # a 4-layer MLP sized so a step takes ~10-100 ms here
model = get_model(name, **overrides)
inputs = example_inputs(name, batch, **overrides)
"""),
    md("The frontier on 2 CPU ranks, priced with the measured profile:"),
    code(f"""
f = tensoropt.frontier(model, "cpu:2", inputs, profile=PROFILE, progress=False)
f.to_pandas()[{COLUMNS}]
"""),
    code("""
budget = "30MB"
plan = f.best(memory_budget=budget)
print(plan)
print(plan.describe(max_rows=12))
ax = f.plot(memory_budget=budget)
plt.show()
"""),
    md("""
Run it for real: 2 ranks, a few Adam steps, median step time and peak memory per rank
(MemTracker). The data-parallel reference plan runs alongside for comparison.
"""),
    code("""
runs = measure_plans("mlp", [plan, f.reference["data parallel"]], world=2, steps=5)
table = pd.DataFrame(runs)
table["time_ratio"] = table.measured_time_s / table.predicted_time_s
table["memory_ratio"] = table.measured_memory_bytes / table.predicted_memory_bytes
table
"""),
    md("""
Memory is predicted from first principles and lands close; time on this shared 2-core
CPU is dominated by per-step and per-operator overheads the micro-benchmarks do not see.
The cost terms fitted on other runs price the search itself; the two plans measured
above, priced with them (their features are their times under each term alone):
"""),
    code("""
from tensoropt.calibration import calibrated_time

fc = tensoropt.frontier(model, "cpu:2", inputs, profile=PROFILE, calibration=CALIBRATION, progress=False)
table["calibrated_time_s"] = [calibrated_time(p, model, inputs, CALIBRATION, PROFILE)
                              for p in (plan, f.reference["data parallel"])]
print("fastest within the budget under the calibrated model:", fc.best(memory_budget=budget))
table[["plan", "predicted_time_s", "calibrated_time_s", "measured_time_s"]]
"""),
    code("""
print(f"CHECK training budget_bytes={parse_bytes(budget)} plan_bytes={plan.peak_memory_bytes!r} "
      f"measured_bytes={runs[0]['measured_memory_bytes']} loss_first={runs[0]['loss_first']!r} "
      f"loss_last={runs[0]['loss_last']!r}")
"""),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_vision_tradeoffs.ipynb": VISION,
    "03_language_tradeoffs.ipynb": LANGUAGE,
    "04_budget_to_training.ipynb": TRAINING,
}


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a notebook differs from its source here")
    args = ap.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, cells in NOTEBOOKS.items():
        text = nbformat.writes(build(cells)) + "\n"
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python scripts/make_notebooks.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

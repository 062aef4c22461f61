"""What the apply layer consumes: a plan expressed in DTensor's vocabulary.

The planner's per-operator choices are turned into one ``ModuleSharding`` per module
that owns parameters, plus the mesh. Placements are written as DTensor writes them:
``"R"`` (replicate), ``"S(d)"`` (shard tensor dim d), ``"P"`` (partial sums, outputs only).
Each tuple holds one placement per mesh axis, in mesh-axis order.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModuleSharding:
    module: str                                   # FQN of a module that owns parameters
    module_type: str                              # e.g. "Linear", "Embedding", "LayerNorm", "Conv2d"
    params: dict[str, tuple[str, ...]]            # local parameter name -> placement per mesh axis
    inputs: tuple[tuple[str, ...], ...]           # per activation input: placement per mesh axis
    output: tuple[str, ...]                       # the output's placement per mesh axis ("P" allowed)


@dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...]                        # e.g. (2, 2)
    axis_names: tuple[str, ...]                   # e.g. ("dp", "tp")


@dataclass(frozen=True)
class ApplySpec:
    """Everything ``tensoropt.parallelize`` needs to lay a model out."""
    model: str                                    # model name the plan was made for
    param_signature: str                          # hash of the model's parameter names and shapes
    mesh: MeshSpec
    # Mesh axes over which every operator splits the batch: applied with fully_shard / replicate.
    data_axes: tuple[int, ...]
    modules: tuple[ModuleSharding, ...]           # the rest, applied with DTensor
    input_placements: tuple[tuple[str, ...], ...] = ()  # the model inputs' placements per mesh axis
    zero_stage: int = 0                           # 0: replicate on data axes; 3: fully_shard
    recompute: tuple[str, ...] = field(default=())  # module FQNs wrapped with activation checkpointing

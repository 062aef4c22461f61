"""What a training step is: precision and optimizer, and the bytes they give each tensor.

Plain data, no torch: the cost model, the collective rules (``traffic``) and calibration
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .opgraph import TensorSpec

__all__ = ["TrainingConfig", "PRECISIONS", "OPTIMIZERS", "ZERO_STAGES", "AUTOCAST_FP32_OPS", "runs_in_fp32"]

ZERO_STAGES = (0, 1, 2, 3)

PRECISIONS = ("fp32", "bf16-mixed")
OPTIMIZERS = ("adam", "sgd", "sgd-momentum")

# Bytes per parameter: (parameter, gradient, optimizer state). Mixed precision keeps an
# fp32 master copy in the optimizer state: 2 + 2 + 12 = 16 for Adam (ZeRO paper, costs.md).
_STATE_BYTES = {
    ("fp32", "adam"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 0),
    ("fp32", "sgd-momentum"): (4, 4, 4),
    ("bf16-mixed", "adam"): (2, 2, 12),
    ("bf16-mixed", "sgd"): (2, 2, 4),
    ("bf16-mixed", "sgd-momentum"): (2, 2, 8),
}


# Elementwise aten ops that CUDA autocast runs in fp32 (the "ops that can autocast to float32"
# of PyTorch's automatic mixed precision documentation): an fp32 result that the ops after it in
# a fused group promote with.
AUTOCAST_FP32_OPS = frozenset((
    "pow", "exp", "expm1", "log", "log10", "log1p", "log2", "reciprocal", "rsqrt", "sinh", "cosh", "tan",
    "acos", "asin", "erfinv", "softplus", "softmax", "_softmax", "log_softmax", "_log_softmax",
))


def runs_in_fp32(aten: tuple[str, ...]) -> bool:
    """Whether autocast runs some op of a captured group (``Operator.aten``) in fp32."""
    return any(name.split(".")[1] in AUTOCAST_FP32_OPS for name in aten if name.count(".") >= 1)


@dataclass(frozen=True)
class TrainingConfig:
    precision: str = "fp32"      # "fp32" or "bf16-mixed"
    optimizer: str = "adam"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")

    @staticmethod
    def of_plan(training: dict | None) -> "TrainingConfig":
        """The configuration a plan records (``Plan.training``)."""
        training = training or {}
        return TrainingConfig(training.get("precision", "fp32"), training.get("optimizer", "adam"))

    @property
    def state_bytes_per_param(self) -> tuple[int, int, int]:
        """(parameter, gradient, optimizer state) bytes per parameter."""
        return _STATE_BYTES[(self.precision, self.optimizer)]

    @property
    def activation_itemsize(self) -> int:
        return 2 if self.precision == "bf16-mixed" else 4

    @property
    def compute_dtype(self) -> str:
        return "bf16" if self.precision == "bf16-mixed" else "fp32"

    def scale(self, spec: TensorSpec) -> float:
        """Bytes of a captured float tensor at the training precision, per captured byte
        (integers keep theirs)."""
        if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat"):
            return self.activation_itemsize / spec.itemsize
        return 1.0

    def intermediate_scale(self, spec: TensorSpec, aten: tuple[str, ...]) -> float:
        """:meth:`scale` for the intermediates an elementwise group saves or holds in backward
        (``Operator.saved_extra_bytes``, ``backward_extra_bytes``): in fp32 under mixed precision
        where autocast runs an op of the group in fp32, since the ops after it promote to fp32
        (transformers' GPT-2 GELU, written out with ``pow`` and ``tanh``)."""
        return self.loss_scale(spec) if self.precision == "bf16-mixed" and runs_in_fp32(aten) else self.scale(spec)

    def loss_scale(self, spec: TensorSpec) -> float:
        """:meth:`scale` for the tensors a loss computes with: a loss runs in fp32 under mixed
        precision (autocast's fp32 list has the cross-entropy and log-softmax; transformers
        and torchtitan upcast the logits before it)."""
        if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat"):
            return 4 / spec.itemsize
        return 1.0

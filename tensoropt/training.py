"""What a training step is: precision and optimizer, and the bytes they give each tensor.

Plain data, no torch: the cost model, the collective rules (``traffic``) and calibration
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .opgraph import TensorSpec

__all__ = ["TrainingConfig", "PRECISIONS", "OPTIMIZERS", "ZERO_STAGES"]

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

    def loss_scale(self, spec: TensorSpec) -> float:
        """:meth:`scale` for the tensors a loss computes with: a loss runs in fp32 under mixed
        precision (autocast's fp32 list has the cross-entropy and log-softmax; transformers
        and torchtitan upcast the logits before it)."""
        if spec.dtype.startswith("float") or spec.dtype.startswith("bfloat"):
            return 4 / spec.itemsize
        return 1.0

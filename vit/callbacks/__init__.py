"""Lightning callbacks, one per file. Each decides *when*; a library function decides *what*."""

from .metadata import CheckpointMetadata
from .nonfinite import NonFiniteError, NonFiniteGuard
from .patch_dropout import UnmaskedEpochs
from .predictions import PredictionWriter
from .resume import Preempted, ResumeCheckpoint
from .rollout import DISTANCE_KEY, ROLLOUT_KEY, AttentionRolloutLogger, explained_model, select_indices
from .run_summary import RunSummary, count_parameters, forward_flops
from .throughput import TrainingThroughput, training_throughput
from .time_budget import TimeBudget

__all__ = [
    "DISTANCE_KEY",
    "ROLLOUT_KEY",
    "AttentionRolloutLogger",
    "CheckpointMetadata",
    "NonFiniteError",
    "NonFiniteGuard",
    "Preempted",
    "PredictionWriter",
    "ResumeCheckpoint",
    "RunSummary",
    "TimeBudget",
    "TrainingThroughput",
    "UnmaskedEpochs",
    "count_parameters",
    "explained_model",
    "forward_flops",
    "select_indices",
    "training_throughput",
]

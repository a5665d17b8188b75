"""Lightning callbacks, one per file. Each decides *when*; a library function decides *what*."""

from .augment_tail import BasicAugmentTail
from .evaluation import EvaluationReport
from .explanations import (
    DISTANCE_KEY,
    ROLLOUT_KEY,
    AttentionRolloutLogger,
    ExplanationLogger,
    explained_model,
    select_indices,
)
from .metadata import CheckpointMetadata
from .nonfinite import NonFiniteError, NonFiniteGuard
from .patch_dropout import UnmaskedEpochs
from .predictions import PredictionWriter
from .resume import Preempted, ResumeCheckpoint
from .run_summary import RunSummary, count_parameters, forward_flops
from .throughput import TrainingThroughput, training_throughput
from .time_budget import TimeBudget

__all__ = [
    "DISTANCE_KEY",
    "ROLLOUT_KEY",
    "AttentionRolloutLogger",
    "BasicAugmentTail",
    "CheckpointMetadata",
    "EvaluationReport",
    "ExplanationLogger",
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

"""Lightning callbacks, one per file. Each decides *when*; a library function decides *what*."""

from .nonfinite import NonFiniteError, NonFiniteGuard
from .predictions import PredictionWriter
from .resume import Preempted, ResumeCheckpoint
from .rollout import DISTANCE_KEY, ROLLOUT_KEY, AttentionRolloutLogger, explained_model, select_indices
from .run_summary import RunSummary, count_parameters, forward_flops

__all__ = [
    "DISTANCE_KEY",
    "ROLLOUT_KEY",
    "AttentionRolloutLogger",
    "NonFiniteError",
    "NonFiniteGuard",
    "Preempted",
    "PredictionWriter",
    "ResumeCheckpoint",
    "RunSummary",
    "count_parameters",
    "explained_model",
    "forward_flops",
    "select_indices",
]

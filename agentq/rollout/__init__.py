"""Rollout backends: the protocol (`backend.py`) and the built-in torch engine."""
from .backend import RolloutBackend, SamplingParams, SyncStats, TurnRequest, TurnResult

__all__ = ["RolloutBackend", "SamplingParams", "SyncStats", "TurnRequest", "TurnResult"]

"""The agent layer: chat rendering to token ids, action parsing, the trajectory record and the
multi-turn episode loop."""
from .chat import ChatFormat
from .loop import AgentLoop, BackendPolicy, EpisodeSpec, ExpertPolicy, PromptConfig, episode_seed
from .parser import ActionParser
from .trajectory import END_REASONS, Trajectory

__all__ = ["ActionParser", "AgentLoop", "BackendPolicy", "ChatFormat", "END_REASONS", "EpisodeSpec", "ExpertPolicy",
           "PromptConfig", "Trajectory", "episode_seed"]

"""TextWorldExpress for agentq: `TextWorldExpressEnv` (env.py; its expert is the game's gold path).
The smallest environment package, and the template for a new one. See docs/envs/textworld_express.md."""
from .env import TextWorldExpressEnv

__all__ = ["TextWorldExpressEnv"]

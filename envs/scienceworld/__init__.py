"""ScienceWorld for agentq: `ScienceWorldEnv` (env.py), the shared heap-capped JVM (jvm.py),
task selection and splits (tasks.py). See docs/envs/scienceworld.md."""
from .env import ScienceWorldEnv
from .jvm import JVMHost
from .tasks import EASY, SIMPLIFICATIONS, SPLITS, SWTask, all_tasks, resolve_tasks, select_tasks

__all__ = ["EASY", "JVMHost", "SIMPLIFICATIONS", "SPLITS", "SWTask", "ScienceWorldEnv", "all_tasks",
           "resolve_tasks", "select_tasks"]

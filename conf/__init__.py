"""agentq.conf: the Hydra configs (the top-level folder `conf/`, installed as `agentq.conf` by setup.py)."""

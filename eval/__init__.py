"""agentq.eval: held-out evaluation, metrics, reports, plots and benchmarks."""

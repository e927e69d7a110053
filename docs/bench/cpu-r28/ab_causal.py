"""A/B of the learner's causal attention on the default run's RL step: arm 'masked' restores the
masked call the commit replaced (same bits), arm 'causal' is the commit."""
import sys
if __name__ == "__main__":
    arm = sys.argv.pop(1)
    import torch
    from agentq.kernels import attention as A
    if arm == "masked":
        def masked(q, k, v, scale):
            t = q.shape[2]
            allowed = torch.ones(t, t, dtype=torch.bool).tril().expand(q.shape[0], t, t)
            return A.masked_attention(q, k, v, allowed, scale)
        A.causal_attention = masked
    import agentq.eval.bench_cpu as b
    sys.argv = ["bench_cpu", "--eval-episodes", "0", "--arms", "on", "--work", "/tmp/bcpu"]
    b.main()

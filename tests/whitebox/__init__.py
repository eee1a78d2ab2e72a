"""White-box tests: the one folder whose tests may import private (underscore) modules and patch them.

They check one part's rules directly, where its public face would need a whole search, a GPU or a
second machine to reach them: the planner's feasibility and checkpoint order, the budget, the sampler,
the CLI's context, a probe run in this process (on a fake clock where it times data), the CUDA backend
against fakes of NVML and torch.cuda. Everything else tests autofit through what it exports, so these
are the tests to rewrite when a private module moves."""

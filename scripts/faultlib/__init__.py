"""Real-fault infrastructure for eroica's fault bench and tests.

- ``netns``: fake "hosts" (network namespaces on a bridge, each with its own hostname), slow links
  (tbf rate limits, NFQUEUE fixed delays) and the mpiexec layout that puts rank i on host i.
- ``nfq_delay``: the NFQUEUE packet delayer (pure Python over netlink, no extra dependency).
- ``faults``: in-process and external fault injectors (compute, CPU throttle/contention, SIGSTOP,
  slow dataset, GC storms, slow storage) that start at a step, persistent or intermittent.
- ``train_bench``: the tiny DDP training script the bench plants faults into.
"""

"""gpulab.enforcement: how a user's work is held to its slice and its account.

Shared by the spawners, the job and serving backends and the service: slice
environment variables, Kubernetes pod patches (HAMi, MIG, MPS...), Unix accounts,
cgroup limits and the device nodes of GPUs.
"""

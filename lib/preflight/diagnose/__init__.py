"""Evidence read from a team's real job: NCCL_DEBUG=INFO logs, the node topology (and, next, the
profiler traces of every rank)."""

"""Tensor parallelism over torch.distributed: a process's place in the group (`state`), the
collectives the sharded model calls (`collectives`) and which slice of each checkpoint tensor a
rank reads (`shard_plan`). Modules are imported by their full path; nothing is re-exported."""

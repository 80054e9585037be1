"""Tensor parallelism over torch.distributed: one model split across several processes.

Rank 0 owns the scheduler, the tokenizer and the HTTP server; the other ranks run the worker
loop (``ferrollm.distributed.worker``), each holding its shard of the model and of the paged KV
cache. Every step rank 0 broadcasts the plan's columns and all ranks run the same forward, so
the collectives inside the model line up; only rank 0 samples.
"""

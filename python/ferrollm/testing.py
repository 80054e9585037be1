"""Test oracles: pieces of the Rust core exposed one at a time, so tests and benchmarks can hold
each against a reference (transformers' sampling, a whole-text stop rule). The engine calls
none of them: sampling and stop strings run inside `Scheduler.update`. Not part of the serving
API."""

from __future__ import annotations

from ferrollm._core import Sampler, SampleResult, truncate_at_stop

__all__ = ["SampleResult", "Sampler", "truncate_at_stop"]

"""``ferrollm bench``: load generation and offline benchmarks, with plots.

``bench serve`` drives any OpenAI-compatible server (ferrollm, llama-server, vLLM) with
streaming requests and reports TTFT, ITL, TPOT and end-to-end latency percentiles, throughput
and goodput, as a JSON file, PNG plots and an HTML report; ``bench plot`` overlays result
files; ``bench throughput`` and ``bench latency`` run the offline `ferrollm.LLM`. The flags
follow ``vllm bench``'s where they overlap (docs/benchmarks.md).

One module per concern: `datasets` (prompts), `loadgen` (HTTP clients and arrivals),
`metrics` (percentiles and goodput), `plots` (matplotlib figures and the report), `offline`
(the `LLM` benchmarks), `cli` (the argument parser). httpx and matplotlib come from the
``bench`` extra and are imported only by the modules that use them.
"""

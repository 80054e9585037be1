"""Random weights for ``load_format="dummy"``: a model's shape without its checkpoint.

What a benchmark of a large model needs (decode is memory-bound, so its speed depends on the
bytes of the weights, not their values) without shipping them. Every parameter is filled in
place, on its device and in its dtype: no file is read, and nothing is made on the host and
copied over (no float32 copy either):

* norm scales are 1 (an `OffsetRMSNorm`, which stores the offset from one, gets 0), so
  activations keep their scale through the layers as in a trained model;
* everything else is uniform in [-`DUMMY_RANGE`, `DUMMY_RANGE`] (vLLM's dummy loader's range).

Values are seeded by parameter name, so a load is reproducible and the ranks of a
tensor-parallel group agree on the parameters they each hold whole (a rank fills its own
shard of a split one: its values are the same on every rank, which no benchmark can tell).
The output is meaningless text; `ignore_eos` keeps lengths fixed.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from ferrollm.layers.norm import OffsetRMSNorm, RMSNorm

#: Half-width of the uniform fill: small enough that logits stay near zero whatever the depth.
DUMMY_RANGE = 1e-3


@torch.no_grad()
def fill_dummy_weights(model: nn.Module) -> None:
    """Fill every parameter of ``model`` (dense: a quantized layer holds none to fill) with
    seeded random values, norm scales with their identity (see the module docstring)."""
    for path, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, RMSNorm) and name == "weight":
                param.fill_(0.0 if isinstance(module, OffsetRMSNorm) else 1.0)
                continue
            generator = torch.Generator(device=param.device)
            generator.manual_seed(zlib.crc32(f"{path}.{name}".encode()))
            param.uniform_(-DUMMY_RANGE, DUMMY_RANGE, generator=generator)

"""Loading a Llama-shaped model from Hugging Face-named checkpoint tensors.

``HfCheckpointModel`` is the base of ``LlamaForCausalLM``: ``load_weights`` routes each tensor
to the shard of the merged ``Linear`` it belongs to (``model.layers.0.self_attn.k_proj`` ->
shard ``k_proj`` of ``qkv_proj``), splits the tensors a family's checkpoints store fused
(``fused_checkpoint``), copies every other parameter by name, and names what is unknown,
misshapen or missing. A family whose checkpoints name tensors otherwise renames them in
``checkpoint_tensors`` (mixtures of experts) or ``_load_one`` (ChatGLM).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ferrollm.layers.linear import Linear, Weight, copy_checked, dense_tensor
from ferrollm.layers.parallel import pad_rows
from ferrollm.models.llama_parallel import FusedPart


class HfCheckpointModel(nn.Module):
    """What a model built of ``Linear`` layers needs to load an HF checkpoint: its ``config``
    (``tie_word_embeddings``), ``model.embed_tokens``, an ``lm_head`` (None: tied and dense)
    and this rank's split of fused tensors (``fused_parts``)."""

    #: Merged layers (``qkv_proj``, ``gate_up_proj``) that checkpoints store as one stacked
    #: tensor (Phi-3 both; GLM gate/up), rather than one tensor per projection.
    fused_checkpoint: frozenset[str] = frozenset()
    config: Any
    model: Any
    lm_head: Linear | None
    fused_parts: dict[str, tuple[FusedPart, ...]]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """Copy HF-named checkpoint tensors (dense or group-quantized) into the model.

        Raises ValueError on an unknown name, a shape mismatch or a missing tensor, naming it.
        """
        routes = self._routes()
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in self.checkpoint_tensors(weights):
            if self._ignored(name):
                continue
            self._load_one(routes, params, name, tensor)
            loaded.add(name)
        missing = sorted(set(self.checkpoint_names()) - loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint lacks {len(missing)} tensors the model needs: {shown}")

    def checkpoint_tensors(
        self, weights: Iterable[tuple[str, Weight]]
    ) -> Iterable[tuple[str, Weight]]:
        """The checkpoint's tensors under the names `checkpoint_names` lists: as they are here; a
        family whose checkpoints name (or stack) tensors otherwise renames them
        (``ferrollm.models.moe``)."""
        return weights

    def checkpoint_names(self) -> list[str]:
        """The HF tensor names a checkpoint of this model must provide."""
        names = [
            f"{path}.{kind}"
            for path, (layer, _) in self._routes().items()
            for kind in (("weight", "bias") if layer.bias is not None else ("weight",))
        ]
        if self.lm_head is not None and self.config.tie_word_embeddings:
            names.remove("lm_head.weight")  # loaded from the embedding table
        names.append("model.embed_tokens.weight")
        linear_params = {
            f"{path}.{kind}"
            for path, m in self.named_modules()
            if isinstance(m, Linear)
            for kind in ("weight", "bias")
        }
        names += [
            n
            for n, _ in self.named_parameters()
            if n not in linear_params and n != "model.embed_tokens.weight"
        ]
        return names

    def _routes(self) -> dict[str, tuple[Linear, str | None]]:
        """HF projection path (``model.layers.0.self_attn.q_proj``) -> (layer, shard); with
        ``fused_checkpoint``, a merged layer's own path -> (layer, None): all its shards."""
        routes: dict[str, tuple[Linear, str | None]] = {}
        for path, module in self.named_modules():
            if isinstance(module, Linear):
                parent = path.rpartition(".")[0]
                if path.rpartition(".")[2] in self.fused_checkpoint:
                    routes[path] = (module, None)
                    continue
                for shard in module.shard_slices:
                    routes[f"{parent}.{shard}" if parent else shard] = (module, shard)
        return routes

    def _ignored(self, name: str) -> bool:
        # Old checkpoints carry the RoPE table; tied models sometimes also save lm_head.
        return name.endswith("rotary_emb.inv_freq") or (
            self.config.tie_word_embeddings and name == "lm_head.weight"
        )

    def _load_one(
        self,
        routes: dict[str, tuple[Linear, str | None]],
        params: dict[str, nn.Parameter],
        name: str,
        tensor: Weight,
    ) -> None:
        if name == "model.embed_tokens.weight":
            self.model.embed_tokens.load(tensor)
            if self.lm_head is not None and self.config.tie_word_embeddings:
                self.lm_head.load_shard(
                    "lm_head", "weight", pad_rows(tensor, self.lm_head.out_features)
                )
            return
        if name == "lm_head.weight" and self.lm_head is not None:
            tensor = pad_rows(tensor, self.lm_head.out_features)
        path, _, kind = name.rpartition(".")
        if path in routes:
            layer, shard = routes[path]
            if shard is None:  # model.layers.{i}.{suffix}: a fused tensor of every shard
                layer.load_fused(name, kind, tensor, self.fused_parts[path.split(".", 3)[3]])
            else:
                layer.load_shard(shard, kind, tensor)
            return
        if name not in params:
            raise ValueError(f"checkpoint tensor `{name}` does not belong to this model")
        copy_checked(params[name].data, dense_tensor(tensor, params[name].dtype), name)

"""Running models: checkpoint loaders, the KV cache and the model runner."""

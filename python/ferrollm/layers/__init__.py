"""Model building blocks in plain torch: paged attention, rotary embeddings, norms, linears.

Nothing here is device-specific: the platform layer (``ferrollm.platforms``) picks the
attention backend, and the layers run on whatever device their tensors live on.
"""

"""Model definitions and their configuration (one decoder serves the Llama family)."""

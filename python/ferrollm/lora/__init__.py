"""LoRA adapters over one base model: PEFT adapters read and checked (``adapter``), the slots
many of them share in one batch (``layers``), the engine's adapters by name (``manager``), and
the options (``options``) and offline request (``request``), which import no torch."""

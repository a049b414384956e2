"""Files shipped with the package: the tiny backbone trained on the synthetic suite (the demo's default model)."""

from pathlib import Path

TINY_BACKBONE = Path(__file__).parent / "backbone_tiny"

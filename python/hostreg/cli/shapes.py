"""The shapes of ``hostreg stage``'s embedded models (``models.py`` builds them), without
torch: the command line lists them in its help, and ``hostreg doctor`` must run where torch is
not installed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    positions: int
    width: int
    layers: int
    heads: int


MODELS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab=1024, positions=128, width=64, layers=2, heads=4),
    "gpt2": GPTConfig(vocab=50257, positions=1024, width=768, layers=12, heads=12),
    "gpt2-medium": GPTConfig(vocab=50257, positions=1024, width=1024, layers=24, heads=16),
    "gpt2-large": GPTConfig(vocab=50257, positions=1024, width=1280, layers=36, heads=20),
    "gpt2-xl": GPTConfig(vocab=50257, positions=1024, width=1600, layers=48, heads=25),
}
DEFAULT_MODEL = "gpt2"

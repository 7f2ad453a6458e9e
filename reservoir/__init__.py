"""reservoir: frozen pretrained transformers as feature extractors for non-language data."""

__version__ = "0.1.0"

"""portkit: port features and patch series across drifting vendored llama.cpp trees."""

__version__ = "0.1.0"

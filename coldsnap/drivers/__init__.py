"""Snapshot drivers: n580 (context-free template) and n610 (process + CUDA capsule)."""

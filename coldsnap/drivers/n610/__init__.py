"""The n610 driver."""

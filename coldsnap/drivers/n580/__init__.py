"""The n580 driver."""

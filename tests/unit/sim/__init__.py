"""Unit tests of the simulator (pure parts)."""

"""Tests of the scheduler mode."""

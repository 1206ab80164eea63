"""Builders shared by tests (tiny random models of every supported family)."""

"""Worked answers to the exercises (one file per exercise, same names as the stubs)."""

"""Metric functions: one vectorised definition each (numpy/scipy/SimpleITK, no torch)."""

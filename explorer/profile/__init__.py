"""Profiling: compiled programs priced by a platform model, or measured on devices."""

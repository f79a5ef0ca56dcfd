"""Per-chapter audit logic: turn the profile and the measurements into findings.

Notebooks call these functions (and explain them); tests call them directly.
"""

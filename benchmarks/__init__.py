"""Scripts that produce the figures in docs/ (run from the repository root)."""

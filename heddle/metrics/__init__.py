"""Request records and the reports computed from them (bench, simulate and /metrics alike)."""

"""Agent sessions: parked KV of paused programs and the keep / offload / drop decision."""

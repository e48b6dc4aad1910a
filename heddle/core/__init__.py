"""The scheduling core: pure Python, no torch. Shared by the real engine and the simulator."""

"""The engine loop (schedule -> execute -> update), its async wrapper and the offline API."""

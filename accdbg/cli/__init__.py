"""The command layer: parses flags, calls the Python API, prints one-line errors."""

"""Pairing golden and target tensors: names (tensor mapping), layouts, and execution order."""

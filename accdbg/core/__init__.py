"""Pieces every component shares: run folders, tensor files, inputs, logging."""

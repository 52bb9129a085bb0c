"""The real-model gauntlet: trained models shipped in PyPI packages, run through accdbg."""

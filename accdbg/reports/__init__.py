"""Report writers: CSV, JSON, HTML and Excel views of results."""

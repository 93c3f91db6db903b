"""camlir command-line tools."""

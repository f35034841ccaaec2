"""The `electric` command."""

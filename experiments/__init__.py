"""Runnable experiments: `python -m experiments.<name> --flagfile=...`."""

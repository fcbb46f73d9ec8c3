"""Benchmarks kept out of the default suite (``make bench``)."""

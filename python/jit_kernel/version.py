"""The package version: the single source for pyproject (regex provider) and the cache key."""

__version__ = "0.1.0"

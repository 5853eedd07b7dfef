"""Faults injected for the tests (``SLATE_*`` environment hooks): never set in a real run."""

"""What loading a model can refuse; every message is one line for users."""

from __future__ import annotations


class ModelNotFound(FileNotFoundError):
    """A model that cannot be found or fetched."""


class DeviceError(ValueError):
    """A --device this torch build or machine cannot use."""

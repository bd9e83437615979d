"""The version of daskqueue, in one place: ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``),
``daskqueue.__version__`` and ``daskqueue --version`` show it."""

__version__ = "0.3.0"

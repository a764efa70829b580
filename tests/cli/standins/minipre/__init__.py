"""A miniature of mmpretrain's layout (see ../README.md); nothing is imported here."""

import importlib_metadata  # noqa: F401 (mmpretrain imports the backport too)

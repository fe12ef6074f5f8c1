"""The whole reliability corpus: ``cases.py`` (issue 10's categories) and ``newer_parts.py`` (issue
29's), registered into one list."""

from tests.reliability import newer_parts  # noqa: F401  (registers its cases into CASES)
from tests.reliability.cases import CASES, CATEGORIES

__all__ = ["CASES", "CATEGORIES"]

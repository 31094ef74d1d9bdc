"""The examples in the SDK's docstrings, run as tests (those that need no agent)."""

import doctest
import unittest

from fakehost import idem


def load_tests(
    loader: unittest.TestLoader, tests: unittest.TestSuite, pattern: str | None
) -> unittest.TestSuite:
    for module in (idem._keys, idem._retry, idem._children, idem.http):
        tests.addTests(doctest.DocTestSuite(module))
    return tests

"""Every test runs under its own MSGQ_PREFIX and must leave no segment behind."""

import os
import sys

import pytest

from msgq.testing import isolated_prefix

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def msgq_prefix():
    with isolated_prefix() as prefix:
        yield prefix

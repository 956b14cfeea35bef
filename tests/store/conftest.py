"""Session fixtures: one tiny target dir and one tiny PREPARED dir for all store tests."""

import pytest

from storekit import ROWS, make_prepared, make_tiny_target


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return make_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("prepared"), ROWS)

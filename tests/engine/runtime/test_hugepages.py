"""engine.runtime.hugepages: NumPy's huge-page advice switched at run time (no services)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from numpy._core import multiarray

from engine.runtime.hugepages import numpy_hugepages


@pytest.fixture
def restored() -> Iterator[None]:
    before = multiarray._get_madvise_hugepage()
    yield
    multiarray._set_madvise_hugepage(before)


@pytest.mark.usefixtures("restored")
def test_the_switch_sets_numpys_choice_and_says_what_it_was() -> None:
    multiarray._set_madvise_hugepage(True)
    assert numpy_hugepages(False) is True
    assert multiarray._get_madvise_hugepage() is False
    assert numpy_hugepages(True) is False
    assert multiarray._get_madvise_hugepage() is True

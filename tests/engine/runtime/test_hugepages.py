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
def test_off_stops_the_advice_and_says_what_it_was() -> None:
    multiarray._set_madvise_hugepage(True)
    assert numpy_hugepages(False) is True
    assert multiarray._get_madvise_hugepage() is False
    assert numpy_hugepages(False) is False
    assert multiarray._get_madvise_hugepage() is False


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("numpys_choice", [True, False])
def test_allowed_leaves_numpys_own_choice_alone(numpys_choice: bool) -> None:
    """The default setting does not override NumPy's import-time choice (a user's
    NUMPY_MADVISE_HUGEPAGE=0, or an old kernel where NumPy chose no advice)."""
    multiarray._set_madvise_hugepage(numpys_choice)
    assert numpy_hugepages(True) is numpys_choice
    assert multiarray._get_madvise_hugepage() is numpys_choice


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("numpys_choice", [True, False])
def test_the_spares_read_the_same_switch(numpys_choice: bool) -> None:
    """One reading of NumPy's switch for the setting and for the spares' advice."""
    from engine.algorithms import numpy_advises_huge_pages

    multiarray._set_madvise_hugepage(numpys_choice)
    assert numpy_advises_huge_pages() is numpys_choice


@pytest.mark.parametrize("allowed", [True, False])
def test_a_numpy_without_the_switch_keeps_its_import_time_choice(
    monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    from engine.algorithms import numpy_advises_huge_pages

    monkeypatch.delattr(multiarray, "_get_madvise_hugepage")
    assert numpy_advises_huge_pages() is None
    assert numpy_hugepages(allowed) is allowed

"""The hand-made mutants of ``make hand-mutants`` and ``make kernel-mutants`` still apply to the code as it is (each
text occurs once), and applying one changes exactly that text."""

from pathlib import Path

import pytest

from tests import hand_mutants, kernel_mutants

SRC = Path(__file__).resolve().parents[1] / "src"


MUTANTS = hand_mutants.MUTANTS + kernel_mutants.MUTANTS


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_each_mutant_applies_once(mutant, tmp_path):
    copy = tmp_path / mutant[1]
    copy.parent.mkdir(parents=True)
    copy.write_text((SRC / mutant[1]).read_text())
    hand_mutants.apply(tmp_path, mutant)
    assert copy.read_text() == (SRC / mutant[1]).read_text().replace(mutant[2], mutant[3])
    assert copy.read_text() != (SRC / mutant[1]).read_text()


def test_a_text_that_no_longer_occurs_is_refused(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="occurs 0 times, not once"):
        hand_mutants.apply(tmp_path, ("gone", "a.py", "y = 2", "y = 3"))


def test_each_kernel_mutant_names_a_test_file_of_its_kernel():
    root = SRC.parent
    for mutant in kernel_mutants.MUTANTS:
        assert (root / mutant[4]).is_file() and mutant[4].startswith("tests/kernels/test_"), mutant[0]


def test_a_mutants_fate_names_the_failed_test_and_what_failed_a_wrong_number_apart_from_a_crash():
    report = ("FAILED tests/kernels/test_x.py::test_y - AssertionError: exit 1: ...\n"
              "E       AssertionError: exit 1: Traceback (most recent call last):\n"
              "E       AssertionError: ('dq', 4.6, torch.float32)\n"
              "E       assert 1 == 0\n"
              "E        +  where 1 = CompletedProcess(...).returncode\n")
    assert hand_mutants._why(report) == ("FAILED tests/kernels/test_x.py::test_y  "
                                         "AssertionError: ('dq', 4.6, torch.float32)")
    crash = "FAILED tests/kernels/test_x.py::test_y - AssertionError\nE       AssertionError: exit -11: \n"
    assert hand_mutants._why(crash).endswith("AssertionError: exit -11:")

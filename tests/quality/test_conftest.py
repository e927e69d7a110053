"""One conftest.py for the whole suite.

Test modules import its helpers by name (`from conftest import run_cli, REPO`): pytest's default
import mode puts each test folder on sys.path, so a second conftest.py in any folder under tests/
can shadow the top-level one for modules collected after it (CI once failed to collect three
modules that way). Fixtures shared by one folder's tests go into tests/conftest.py too."""
from layout import REPO


def test_the_suite_has_one_conftest():
    found = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("conftest.py"))
    assert found == ["tests/conftest.py"], f"conftest.py files besides tests/conftest.py: {found}"

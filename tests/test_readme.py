"""README.md is a user's page: short, in a user's order, every relative link resolving, and the
test command it states the one CI runs. (docs/build_readme.py writes it; docs/make_figures.sh
runs that.)"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the generated docs pages (docs/build_readme.py writes them next to README.md)
GENERATED_PAGES = ["docs/cli.md", "docs/demo.md", "docs/loop.md", "docs/api.md",
                   "docs/guarantees.md", "docs/studies.md"]
SECTIONS = ["Set up", "The demo", "From your training step to a plan in your loop", "Command line",
            "Python API", "File formats", "Guarantees and limits", "Benchmark",
            "Adaptive characterization", "More", "Cite"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _text() -> str:
    return README.read_text()


def _relative_targets(text: str) -> list[str]:
    """Every link target in ``text`` that is a path (no scheme, not a bare anchor)."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_readme_is_at_most_250_lines() -> None:
    assert len(_text().splitlines()) <= 250


def test_readme_sections_in_a_users_order() -> None:
    heads = [ln[3:].strip() for ln in _text().splitlines() if ln.startswith("## ")]
    assert heads == SECTIONS


@pytest.mark.parametrize("page", ["README.md", *GENERATED_PAGES])
def test_every_relative_link_resolves(page: str) -> None:
    path = ROOT / page
    if not path.exists():
        pytest.skip(f"{page} not generated here")
    missing = [t for t in _relative_targets(path.read_text()) if not (path.parent / t).exists()]
    assert not missing, f"{page}: links to missing files {missing}"


def test_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci/run").read_text()
    ci_cmd = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("python -m pytest")]
    assert ci_cmd, ".ci/run runs no 'python -m pytest'"
    assert ci_cmd[-1] in _text(), f"README does not state CI's test command {ci_cmd[-1]!r}"
    extras = re.search(r'pip install --quiet -e "(\.\[[^\]]+\])"', ci)
    assert extras and f'pip install -e "{extras.group(1)}"' in _text()


def test_readme_python_example_is_the_script_that_ran() -> None:
    """The pasted API example is docs/api_quickstart.py (whose output make_figures pastes)."""
    script = (ROOT / "docs/api_quickstart.py").read_text().split("\n", 2)[2].rstrip()
    assert script in _text()


def test_readme_has_no_machine_paths() -> None:
    assert not re.search(r"(^|[\s(`])(/work|/tmp|/home|/Users|\.\./shared)", _text(), re.M)

"""Where the tests' files are, for a test at any depth under test/ (test/unit/build/...)."""

from pathlib import Path

TEST_DIR = Path(__file__).resolve().parent
REPO = TEST_DIR.parent
GOLDEN = TEST_DIR / "golden"
DATA = TEST_DIR / "data"
DOCS = REPO / "docs"

"""The README's example runs as written (GPU), and its Python block stays in sync with this test."""

import re
from pathlib import Path

from tests.helpers import requires_cuda

README = Path(__file__).resolve().parent.parent / "README.md"


def example_code() -> str:
    blocks = re.findall(r"## Example\n\n```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one example block under '## Example'"
    return blocks[0]


def test_example_compiles():
    compile(example_code(), "README.md", "exec")


@requires_cuda
def test_example_runs():
    exec(compile(example_code(), "README.md", "exec"), {"__name__": "readme_example"})

"""The documentation site builds with ``mkdocs build --strict`` (``make docs``).

Strict mode turns every warning into a failure: a page missing from the nav, a link to a page
or heading that does not exist (anchors are GitHub's, as tests/core/test_docs_references.py
reads them), a docstring reference mkdocstrings cannot resolve, or a flag of ``ferrollm serve``
whose option no config dataclass has (the configuration reference is generated from the CLI at
build time by docs/hooks/config_reference.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (site / "reference" / "configuration.html").read_text(encoding="utf-8")
    for flag in ("--kv-cache-memory", "--max-num-seqs", "--api-key", "--lora-modules"):
        assert f"<code>{flag}</code>" in reference, flag
    assert "ferrollm._core.Scheduler" in (site / "reference" / "core.html").read_text("utf-8")
    assert (site / "getting-started.html").is_file()

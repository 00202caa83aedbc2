"""One version everywhere a user reads it: the package, `--version`, build_info, the image tag
deploy/ pulls, the image the README tells how to build, and the newest CHANGELOG entry."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from click.testing import CliRunner

import exporter
from exporter import buildinfo
from exporter.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_package_cli_and_build_info_say_the_pyproject_version():
    version = _pyproject_version()
    assert exporter.__version__ == version
    assert buildinfo.version() == version
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"node-resize-exporter, version {version}"


def test_deploy_pulls_the_image_of_this_version():
    version = _pyproject_version()
    kustomization = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text())
    (image,) = [i for i in kustomization["images"]
                if i["name"] == "node-resize-exporter/node-resize-exporter"]
    assert image["newTag"] == version
    daemonset = yaml.safe_load((REPO / "deploy" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    images = [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]
    assert images and all(i.endswith(f":{version}") for i in images), images


def test_every_version_the_docs_print_is_this_one():
    version = _pyproject_version()
    for path in [REPO / "README.md", REPO / "deploy" / "Dockerfile"]:
        stale = [m for m in re.findall(r"node-resize-exporter[-:](\d+\.\d+\.\d+)",
                                       path.read_text()) if m != version]
        assert not stale, f"{path.name} names version(s) {stale}, not {version}"
    assert f'build_info{{version="{version}"}}' in (REPO / "README.md").read_text()


def test_the_changelog_opens_with_this_version_and_its_rename_table():
    version = _pyproject_version()
    changelog = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, re.M)
    assert headings and headings[0] == version, headings
    # The rename table is the catalogue's, row for row: a rename added there is added here.
    catalogue = (REPO / "docs" / "metrics.md").read_text()
    renames = re.findall(r"^\| \d+ \| (`[^`]+`) \| (`[^`]+`) \|$", catalogue, re.M)
    listed = re.findall(r"^\s*\| (`[^`]+`) \| (`[^`]+`) \|$", changelog, re.M)
    assert renames and listed == renames

"""deploy/ is checked offline: compose against the Compose Specification schema, manifests against the Kubernetes
schemas (both shipped inside registry wheels), and settings keys against the Settings object."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load_validator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_validate", DEPLOY / "validate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_deploy_files_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    validator = load_validator()
    assert validator.main([]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.startswith("ok: ")


def test_broken_files_are_reported(tmp_path: Path) -> None:
    validator = load_validator()
    bad = tmp_path / "deploy"
    shutil.copytree(DEPLOY, bad, ignore=shutil.ignore_patterns("__pycache__"))
    (bad / "env.example").write_text(
        (bad / "env.example").read_text().replace("DPR_API__PORT=8000", "DPR_API__PORT=99999\nDPR_API__NOPE=1")
    )
    api = bad / "k8s" / "api.yaml"
    api.write_text(api.read_text().replace("path: /readyz", "path: /ready").replace("replicas: 2", 'replicas: "2x"'))
    compose = bad / "compose.yaml"
    compose.write_text(compose.read_text().replace('command: ["dpr", "beat"]', 'command: ["dpr", "beet"]'))
    problems = "\n".join(validator.run(bad))
    assert "DPR_API__NOPE is not a setting" in problems
    assert "DPR_API__PORT: Input should be less than or equal to 65535" in problems
    assert "is not of type 'integer'" in problems  # Kubernetes schema
    assert "readinessProbe must GET /readyz" in problems
    assert "`dpr beet` is not a dpr command" in problems

    compose.write_text(compose.read_text().replace("    restart: unless-stopped\n", "    restrat: always\n", 1))
    assert any("'restrat' was unexpected" in p for p in validator.run(bad))  # Compose schema


def test_deploy_files_must_require_an_api_key(tmp_path: Path) -> None:
    """Locked by default: an empty compose default, a shipped Secret, an optional key or --insecure are refused."""
    validator = load_validator()
    bad = tmp_path / "deploy"
    shutil.copytree(DEPLOY, bad, ignore=shutil.ignore_patterns("__pycache__"))
    compose = bad / "compose.yaml"
    text = compose.read_text()
    assert "${DPR_API__API_KEY:?" in text
    compose.write_text(text.replace("${DPR_API__API_KEY:?", "${DPR_API__API_KEY:-", 1).replace(
        '"dpr", "serve", "--host", "0.0.0.0", "--port", "8000"', '"dpr", "serve", "--host", "0.0.0.0", "--insecure"'))
    config = bad / "k8s" / "config.yaml"
    config.write_text(config.read_text() + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: dpr-secrets, "
                      'namespace: dpr}\ntype: Opaque\nstringData:\n  DPR_API__API_KEY: ""\n')
    api = bad / "k8s" / "api.yaml"
    api.write_text(api.read_text().replace("secretRef: {name: dpr-secrets}", "secretRef: {name: dpr-secrets, "
                                           "optional: true}"))
    problems = "\n".join(validator.run(bad))
    assert "services.api must require an API key" in problems
    assert "`dpr serve --insecure` serves without API keys" in problems
    assert "Secret dpr-secrets ships in the manifests" in problems
    assert "the API container must take its key from the Secret dpr-secrets" in problems

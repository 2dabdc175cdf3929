"""Offline validation of the deployment files (no container engine, no cluster, no network needed).

- ``compose.yaml`` against the Compose Specification JSON schema that ships inside the ``check-jsonschema`` wheel;
- every document in ``k8s/*.yaml`` against the Kubernetes OpenAPI schemas that ship inside the
  ``kubernetes-validate`` wheel (strict: unknown fields are errors);
- then what no schema knows: every ``DPR_*`` key in ``env.example`` and the ConfigMap is a real setting and its
  value parses; the two agree; every command is a real ``dpr`` command; the API's probes hit /healthz and
  /readyz on its port; exactly one beat; references (depends_on, volumes, ConfigMaps, Secrets, claims) resolve;
- locked by default: compose requires DPR_API__API_KEY (``${DPR_API__API_KEY:?...}``, never an empty default), no
  manifest ships an API key (the Secret ``dpr-secrets`` is created by the user, and the API pod does not start
  without it), and no ``dpr serve`` runs with ``--insecure``.

    python deploy/validate.py          # exit 0 when everything holds, 1 with one line per problem

Run by tests/unit/test_deploy_validate.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KUBERNETES_VERSION = "1.30.0"
COMPOSE_ONLY_KEYS = {"APP_IMAGE", "WORKER_REPLICAS", "QDRANT_IMAGE"}  # read by compose.yaml, not by dpr
# Secrets the user creates before applying the manifests (never shipped: an empty key would mean no auth).
USER_SECRETS = {"dpr-secrets": "DPR_API__API_KEY"}


# --- settings keys ---------------------------------------------------------------------------------------------


def setting_problems(env: dict[str, str], where: str) -> list[str]:
    """Unknown ``DPR_*`` keys, and values the Settings object refuses."""
    from pydantic import BaseModel, ValidationError

    from services.core.settings import Settings

    problems: list[str] = []
    nested: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith("DPR_"):
            continue
        path = key[len("DPR_"):].lower().split("__")
        model: type[BaseModel] = Settings
        for i, part in enumerate(path):
            field = model.model_fields.get(part)
            if field is None:
                problems.append(f"{where}: {key} is not a setting (no field {'.'.join(path[:i + 1])!r})")
                break
            annotation = field.annotation
            if i < len(path) - 1:
                if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                    problems.append(f"{where}: {key}: {'.'.join(path[:i + 1])} is not a group of settings")
                    break
                model = annotation
        else:
            target = nested
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
    try:
        Settings(_env_file=None, **nested)  # type: ignore[call-arg]
    except ValidationError as e:
        for err in e.errors():
            problems.append(f"{where}: DPR_{'__'.join(str(p) for p in err['loc']).upper()}: {err['msg']}")
    return problems


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path.name}:{lineno}: not KEY=VALUE: {raw!r}")
        env[key.strip()] = value.split(" #")[0].strip()
    return env


def dpr_commands() -> set[str]:
    from entrypoints.cli.main import app

    return {c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None}


def command_problems(command: list[str] | None, where: str, commands: set[str]) -> list[str]:
    if not command or command[0] != "dpr":
        return []
    if len(command) < 2 or command[1] not in commands:
        return [f"{where}: `{' '.join(command)}` is not a dpr command (known: {', '.join(sorted(commands))})"]
    if command[1] == "serve" and "--insecure" in command:
        return [f"{where}: `dpr serve --insecure` serves without API keys; require a key instead (docs/security.md)"]
    return []


# --- compose ---------------------------------------------------------------------------------------------------


def compose_schema() -> dict[str, Any]:
    text = (resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text()
    return dict(json.loads(text))


def schema_errors(document: Any, schema: dict[str, Any], where: str) -> list[str]:
    import jsonschema

    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    out = []
    for err in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        loc = ".".join(str(p) for p in err.absolute_path) or "(top)"
        out.append(f"{where}: {loc}: {err.message[:300]}")
    return out


def check_compose(path: Path, commands: set[str]) -> list[str]:
    where = _shown(path)
    doc = yaml.safe_load(path.read_text())
    problems = schema_errors(doc, compose_schema(), where)
    if problems:
        return problems
    services: dict[str, Any] = doc.get("services", {})
    volumes = set(doc.get("volumes") or {})
    for name, svc in services.items():
        for dep in svc.get("depends_on") or {}:
            if dep not in services:
                problems.append(f"{where}: services.{name}.depends_on names no service {dep!r}")
        for mount in svc.get("volumes") or []:
            source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source")
            if source and not source.startswith((".", "/")) and source not in volumes:
                problems.append(f"{where}: services.{name} mounts undeclared volume {source!r}")
        for env_file in svc.get("env_file") or []:
            entry = env_file if isinstance(env_file, dict) else {"path": env_file, "required": True}
            if entry.get("required", True) and not (path.parent / entry["path"]).is_file():
                problems.append(f"{where}: services.{name}.env_file {entry['path']} does not exist")
        problems += command_problems(svc.get("command"), f"{where}: services.{name}.command", commands)
    for needed in ("redis", "api", "worker", "beat"):
        if needed not in services:
            problems.append(f"{where}: no {needed!r} service")
    qdrant = [n for n in services if n.startswith("qdrant")]
    if len(qdrant) < 3:
        problems.append(f"{where}: a Qdrant cluster needs 3 nodes, found {qdrant}")
    beat = services.get("beat", {})
    if (beat.get("deploy") or {}).get("replicas", 1) != 1:
        problems.append(f"{where}: services.beat must run exactly one replica")
    api_health = " ".join(map(str, ((services.get("api") or {}).get("healthcheck") or {}).get("test") or []))
    if "/readyz" not in api_health:
        problems.append(f"{where}: entrypoints.api.healthcheck must probe /readyz")
    api_env = (services.get("api") or {}).get("environment") or {}
    key = str(api_env.get("DPR_API__API_KEY", "")) if isinstance(api_env, dict) else ""
    if not key.startswith("${DPR_API__API_KEY:?"):
        problems.append(f"{where}: services.api must require an API key: DPR_API__API_KEY: "
                        "${DPR_API__API_KEY:?set an API key} (an empty default serves without keys)")
    return problems


# --- kubernetes ------------------------------------------------------------------------------------------------


def _shown(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def k8s_documents(folder: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(folder.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                yield f"{_shown(path)}[{i}]", doc


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers") or [])


def _probe_target(container: dict[str, Any], probe: str) -> tuple[str | None, Any]:
    get = (container.get(probe) or {}).get("httpGet") or {}
    return get.get("path"), get.get("port")


def check_k8s(folder: Path, env_example: dict[str, str], commands: set[str]) -> list[str]:
    import kubernetes_validate

    problems: list[str] = []
    docs = list(k8s_documents(folder))
    if not docs:
        return [f"{folder}: no manifests"]
    defined: dict[str, set[str]] = {}
    for where, doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}: {e.message[:300]}")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
            problems.append(f"{where}: no schema for {doc.get('apiVersion')}/{doc.get('kind')}: {e}")
        defined.setdefault(doc.get("kind", ""), set()).add(doc.get("metadata", {}).get("name", ""))
        namespace = doc.get("metadata", {}).get("namespace")
        if doc.get("kind") != "Namespace" and namespace != "dpr":
            problems.append(f"{where}: metadata.namespace should be 'dpr', is {namespace!r}")

    by_name = {(d.get("kind"), d.get("metadata", {}).get("name")): (w, d) for w, d in docs}
    for where, doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in _containers(doc):
            problems += command_problems(c.get("command"), f"{where}: container {c.get('name')}", commands)
            for src in c.get("envFrom") or []:
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    ref = (src.get(key) or {}).get("name")
                    if kind == "Secret" and ref in USER_SECRETS:
                        continue  # created by the user (config.yaml says how)
                    if ref and ref not in defined.get(kind, set()):
                        problems.append(f"{where}: {key} {ref!r} is not defined in the manifests")
        for vol in pod.get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and claim not in defined.get("PersistentVolumeClaim", set()):
                problems.append(f"{where}: claim {claim!r} is not defined in the manifests")

    api = by_name.get(("Deployment", "dpr-api"))
    if api is None:
        problems.append("k8s: no Deployment dpr-api")
    else:
        where, doc = api
        [container] = _containers(doc)[:1] or [{}]
        ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
        secrets = [(src.get("secretRef") or {}) for src in container.get("envFrom") or []]
        if not any(ref.get("name") in USER_SECRETS and not ref.get("optional") for ref in secrets):
            problems.append(f"{where}: the API container must take its key from the Secret "
                            f"{', '.join(USER_SECRETS)} (envFrom secretRef, not optional): locked by default")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            got_path, got_port = _probe_target(container, probe)
            if got_path != path or (got_port not in ports and got_port not in ports.values()):
                problems.append(f"{where}: {probe} must GET {path} on the API's port, has {got_path}:{got_port}")
    beat = by_name.get(("Deployment", "dpr-beat"))
    if beat is None or beat[1]["spec"].get("replicas") != 1 or beat[1]["spec"].get("strategy", {}).get(
        "type"
    ) != "Recreate":
        problems.append("k8s: Deployment dpr-beat must have replicas 1 and strategy Recreate")
    if ("Deployment", "dpr-worker") not in by_name:
        problems.append("k8s: no Deployment dpr-worker")
    qdrant = by_name.get(("StatefulSet", "qdrant"))
    if qdrant is not None and qdrant[1]["spec"].get("replicas", 1) < 3:
        problems.append("k8s: StatefulSet qdrant needs 3 replicas for the cluster")

    config = by_name.get(("ConfigMap", "dpr-settings"))
    if config is None:
        problems.append("k8s: no ConfigMap dpr-settings")
    else:
        data = {str(k): str(v) for k, v in (config[1].get("data") or {}).items()}
        problems += setting_problems(data, config[0])
        cm_keys = {k for k in data if k.startswith("DPR_")}
        ex_keys = {k for k in env_example if k.startswith("DPR_")}
        for key in sorted(ex_keys - cm_keys):
            problems.append(f"{config[0]}: {key} is in deploy/env.example but not in the ConfigMap")
        for key in sorted(cm_keys - ex_keys):
            problems.append(f"{config[0]}: {key} is in the ConfigMap but not in deploy/env.example")
    for (kind, name), (where, doc) in by_name.items():
        if kind != "Secret":
            continue
        values = {str(k): str(v) for k, v in (doc.get("stringData") or {}).items()}
        problems += setting_problems(values, where)
        if name in USER_SECRETS or "DPR_API__API_KEY" in values or "DPR_API__API_KEY" in (doc.get("data") or {}):
            problems.append(f"{where}: Secret {name} ships in the manifests; an API key must be created by the user "
                            "(kubectl create secret ..., deploy/k8s/config.yaml), never shipped (empty: no auth)")
    return problems


# --- main ------------------------------------------------------------------------------------------------------


def run(deploy_dir: Path = HERE) -> list[str]:
    commands = dpr_commands()
    env_path = deploy_dir / "env.example"
    env = read_env_file(env_path)
    problems = setting_problems(env, "deploy/env.example")
    for key in env:
        if not key.startswith("DPR_") and key not in COMPOSE_ONLY_KEYS:
            problems.append(f"deploy/env.example: {key} is neither a DPR_ setting nor a known compose variable")
    problems += check_compose(deploy_dir / "compose.yaml", commands)
    problems += check_k8s(deploy_dir / "k8s", env, commands)
    return problems


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    deploy_dir = Path(args[0]).resolve() if args else HERE
    problems = run(deploy_dir)
    for p in problems:
        print(f"error: {p}")
    if not problems:
        docs = sum(1 for _ in k8s_documents(deploy_dir / "k8s"))
        print(f"ok: compose.yaml (Compose Specification), {docs} Kubernetes objects (v{KUBERNETES_VERSION}, strict), "
              "env.example and ConfigMap settings")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())

"""k0s.yaml parsed as k0s v1.36.3+k0s.2 parses it, for the k0s test double (not k0s): against
k0s's own ClusterConfig CRD schema (shipped in the double's zip; in the repository
tests/fixtures/k0s-v1.36.3-clusterconfig-crd.yaml). See the `k0s` script beside this file."""

import zipfile
from pathlib import Path

from k0s_double_common import TOOLS, say

CRD_NAME = "k0s-clusterconfig-crd.yaml"
REPO_CRD = Path(__file__).resolve().parents[1] / "fixtures/k0s-v1.36.3-clusterconfig-crd.yaml"
PREFIX = "error unmarshaling JSON: while decoding JSON: json: "
# Types whose UnmarshalJSON decodes with a plain json.Unmarshal, so the strict decoder's
# DisallowUnknownFields does not reach below them: an unknown field there is ignored by k0s
# (pkg/apis/k0s/v1beta1/api.go:189-198, storage.go:91-98, network.go:243-249, images.go:75-78;
# calico.go:80-90 and nllb.go:66-68 lie under network).
LAX = {("spec", "api"), ("spec", "storage"), ("spec", "network"), ("spec", "images")}
# Unknown fields k0s ignores anywhere (clusterconfig_types.go:313, strictyaml.go:16-29).
IGNORED = {"interval", "podSecurityPolicy"}
JSON_KIND = {str: "string", bool: "bool", int: "number", float: "number", list: "array",
             dict: "object", type(None): "null"}


def crd_schema() -> dict:
    import yaml

    archive = TOOLS / "k0s-test-double.zip"
    text = zipfile.ZipFile(archive).read(CRD_NAME).decode() if archive.exists() \
        else REPO_CRD.read_text()
    crd = next(d for d in yaml.safe_load_all(text) if d and d.get("kind") == "CustomResourceDefinition")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _fits(value: object, schema: dict) -> bool:
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if value is None or kind is None:
        return True  # JSON null leaves Go's zero value
    return {"string": isinstance(value, str), "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "array": isinstance(value, list), "object": isinstance(value, dict)}.get(kind, True)


def schema_errors(value: object, schema: dict, path: tuple[str, ...] = ()) -> list[str]:
    """The errors of sigs.k8s.io/yaml's UnmarshalStrict into ClusterConfig, keys visited in
    sorted order (the YAML goes through a JSON map first): a value of the wrong type, and an
    unknown field outside the lax types (LAX); unknown fields under those are said on stderr
    and ignored, as k0s ignores them."""
    if not _fits(value, schema):
        return [(f"{PREFIX}cannot unmarshal {JSON_KIND.get(type(value), 'value')} into Go struct "
                f"field ClusterConfig.{'.'.join(path)} of type {schema.get('type')}")]
    errors: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        for key in sorted(value, key=str):
            if props is not None and key in props:
                errors += schema_errors(value[key], props[key], (*path, str(key)))
            elif props is not None:
                if key in IGNORED:
                    continue
                if any(path[:len(lax)] == lax for lax in LAX):
                    say(f"k0s ignores the unknown field {'.'.join((*path, str(key)))} (its type's "
                        "UnmarshalJSON is not strict)")
                else:
                    errors.append(f'{PREFIX}unknown field "{key}"')
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(value[key], schema["additionalProperties"], (*path, str(key)))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            errors += schema_errors(item, schema["items"], path)
    return errors


def parse_strict(text: str) -> dict:
    """ClusterConfig.MergedWithYAML (pkg/apis/k0s/v1beta1/clusterconfig_types.go:311-321):
    strict YAML-to-JSON decoding; the first error stops it, with k0s's text."""
    import yaml
    from k0s_double_config import ConfigError

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"error converting YAML to JSON: yaml: {err}") from err
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{PREFIX}cannot unmarshal {JSON_KIND.get(type(doc), 'value')} into Go "
                          "value of type v1beta1.ClusterConfig")
    if errors := schema_errors(doc, crd_schema()):
        raise ConfigError(errors[0])
    return doc

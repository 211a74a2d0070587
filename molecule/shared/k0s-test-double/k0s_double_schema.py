"""k0s.yaml parsed as k0s v1.36.3+k0s.2 parses it, for the k0s test double (not k0s).
See the `k0s` script beside this file."""


def parse_strict(text: str) -> dict:
    """ClusterConfig.MergedWithYAML (pkg/apis/k0s/v1beta1/clusterconfig_types.go:311-321)."""
    import yaml
    from k0s_double_config import ConfigError

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"error converting YAML to JSON: {err}") from err
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError("error unmarshaling JSON: while decoding JSON: json: cannot unmarshal "
                          f"{type(doc).__name__} into Go value of type v1beta1.ClusterConfig")
    return doc

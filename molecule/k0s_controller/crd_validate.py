"""Validate a k0s.yaml against k0s's own ClusterConfig CRD schema (openAPIV3Schema).

usage: crd_validate.py CRD.yaml K0S.yaml  -> exit 0 valid, 1 invalid (errors printed)
"""

import sys

import jsonschema
import yaml


def main() -> int:
    crd_path, config_path = sys.argv[1], sys.argv[2]
    with open(crd_path, encoding="utf-8") as fh:
        crd = yaml.safe_load(fh)
    with open(config_path, encoding="utf-8") as fh:
        config = yaml.safe_load(fh)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == config["apiVersion"].split("/")[1])
    schema = version["schema"]["openAPIV3Schema"]
    assert crd["spec"]["names"]["kind"] == config["kind"], "kind differs from the CRD's"
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(config), key=str)
    for err in errors:
        print(f"{'.'.join(str(p) for p in err.absolute_path)}: {err.message}")
    print("valid" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

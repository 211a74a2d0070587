"""Python side of the k0s external-etcd sandbox: topology, inventory, CLI."""

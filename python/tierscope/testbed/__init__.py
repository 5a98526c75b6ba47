"""The testbed: hosts (network namespaces + cgroups) on one bridge, capture, resource monitor."""

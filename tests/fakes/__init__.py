"""What the tests, `make demo` and the benchmark share: fake GPU hosts (fakehost.py: real
device numbers, real ELF libraries, a real ld cache under a directory), minimal OCI bundles
with a busybox rootfs (bundle.py), a Kubernetes API on loopback (kubeapi.py), a strict reader
of the CDI YAML gpuhook writes (cdi_yaml.py) and proof that nothing touched a host path
(hostwatch.py). Nothing here runs on a node's create path."""

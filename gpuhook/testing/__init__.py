"""What the tests, `make demo` and the benchmark share: fake GPU hosts (fakehost.py: real
device numbers, real ELF libraries, a real ld cache under a directory) and minimal OCI
bundles with a busybox rootfs (bundle.py). Nothing here runs on a node's create path."""

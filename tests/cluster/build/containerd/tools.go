//go:build tools

// Package tools pins the container runtime one test node runs instead of Debian sid's: containerd
// (its daemon, runc shim and ctr) and runc, built from the Go module proxy.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
)

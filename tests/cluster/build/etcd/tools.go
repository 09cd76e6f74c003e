//go:build tools

// Package tools pins the etcd server the cluster tests run (go build go.etcd.io/etcd/server/v3):
// `go install go.etcd.io/etcd/server/v3@VERSION` refuses it, its go.mod has replace directives.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)

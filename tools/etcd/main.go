// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3's etcdmain), built from the
// version pinned in go.mod for the test control plane (scripts/cluster.sh). Nothing here is
// shipped: the product is C++, and this module is a test tool only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

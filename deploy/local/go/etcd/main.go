// Command etcd is the upstream etcd server, built from the go.etcd.io/etcd/server/v3
// module so that the local control plane needs no release download. The version is the
// one k8s.io/kubernetes pins in its go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

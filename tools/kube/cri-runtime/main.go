// cri-runtime serves kubelet a container runtime that needs no images and runs nothing: the
// in-memory CRI runtime and image service Kubernetes' own tests use (k8s.io/cri-client/pkg/fake).
// Containers are records; any image "pulls" at once. Test tooling of scripts/cluster.sh `node`
// (docs/testing.md, "Real nodes"), never shipped.
//
//	cri-runtime --endpoint unix:///DIR/cri.sock
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/cri.sock to serve on")
	flag.Parse()
	if *endpoint == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: cri-runtime --endpoint unix:///path/to/cri.sock")
		os.Exit(2)
	}
	runtime := fake.NewFakeRemoteRuntime()
	// Without a size kubelet refuses every image ("Id or size of image ... is not set"); without
	// filesystems on "/" its eviction manager finds no image filesystem.
	runtime.ImageService.SetFakeImageSize(1 << 20)
	usage := func() []*runtimeapi.FilesystemUsage {
		return []*runtimeapi.FilesystemUsage{{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: "/"},
			UsedBytes:  &runtimeapi.UInt64Value{Value: 1 << 20},
			InodesUsed: &runtimeapi.UInt64Value{Value: 16},
		}}
	}
	runtime.ImageService.SetFakeFilesystemUsage(usage())
	runtime.ImageService.SetFakeContainerFilesystemUsage(usage())
	if err := runtime.Start(*endpoint); err != nil {
		fmt.Fprintf(os.Stderr, "cri-runtime: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "cri-runtime: serving %s\n", *endpoint)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	runtime.Stop()
}

// cri-runtime serves kubelet a container runtime that needs no images and runs nothing: the
// in-memory CRI runtime and image service Kubernetes' own tests use (k8s.io/cri-client/pkg/fake).
// Containers are records; any image "pulls" at once. A container whose image name ends in
// `:exit-N` (N 0 to 255) exits with status N about a second after it starts, so a pod reaches a
// final phase (Succeeded, Failed); every other container runs until it is stopped. Test tooling
// of scripts/cluster.sh `node` (docs/testing.md, "Real nodes"), never shipped.
//
//	cri-runtime --endpoint unix:///DIR/cri.sock
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
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
	go exitContainers(runtime)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	runtime.Stop()
}

var exitImage = regexp.MustCompile(`:exit-([0-9]{1,3})$`)

// exitContainers ends each running container whose image asks it to, a second after its start.
func exitContainers(runtime *fake.RemoteRuntime) {
	service := runtime.RuntimeService
	for range time.Tick(200 * time.Millisecond) {
		now := time.Now().UnixNano()
		service.Lock()
		for _, container := range service.Containers {
			if container.State != runtimeapi.ContainerState_CONTAINER_RUNNING || container.Image == nil {
				continue
			}
			match := exitImage.FindStringSubmatch(container.Image.Image)
			if match == nil || now-container.StartedAt < int64(time.Second) {
				continue
			}
			code, _ := strconv.Atoi(match[1])
			container.State = runtimeapi.ContainerState_CONTAINER_EXITED
			container.FinishedAt = now
			container.ExitCode = int32(code)
			container.Reason = "Completed"
			if code != 0 {
				container.Reason = "Error"
			}
			fmt.Fprintf(os.Stderr, "cri-runtime: container %s (%s) exited %d\n", container.Id,
				container.Image.Image, code)
		}
		service.Unlock()
	}
}

// cri-runtime serves kubelet a container runtime that needs no images and runs nothing: the
// in-memory CRI runtime and image service Kubernetes' own tests use (k8s.io/cri-client/pkg/fake).
// Containers are records; any image "pulls" at once. A container whose image name ends in
// `:exit-N` (N 0 to 255) exits with status N about a second after it starts, so a pod reaches a
// final phase (Succeeded, Failed); every other container runs until it is stopped. The fake keeps
// no record of a container's CDI devices, so each CreateContainer logs the ones kubelet passed
// (the DRA devices its plugins prepared: "cri-runtime: container ID of pod NS/NAME: CDI devices
// [...]"). Test tooling of scripts/cluster.sh `node` (docs/testing.md, "Real nodes"), never
// shipped.
//
//	cri-runtime --endpoint unix:///DIR/cri.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// recording is the fake runtime service with CreateContainer logging the container's CDI devices.
type recording struct{ *fake.RemoteRuntime }

func (r recording) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	response, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return response, err
	}
	names := []string{}
	for _, device := range req.GetConfig().GetCDIDevices() {
		names = append(names, device.GetName())
	}
	pod := req.GetSandboxConfig().GetMetadata()
	fmt.Fprintf(os.Stderr, "cri-runtime: container %s of pod %s/%s: CDI devices [%s]\n",
		response.ContainerId, pod.GetNamespace(), pod.GetName(), strings.Join(names, " "))
	return response, nil
}

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
	// As fake.RemoteRuntime.Start, with the recording runtime service in its place.
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-runtime: listening on %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, recording{runtime})
	runtimeapi.RegisterImageServiceServer(server, runtime)
	go server.Serve(listener)
	runtime.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	fmt.Fprintf(os.Stderr, "cri-runtime: serving %s\n", *endpoint)
	go exitContainers(runtime)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	server.Stop()
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

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
	"path/filepath"
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

// runtimeService is the fake runtime service with CreateContainer logging the container's CDI
// devices and, with --programs, the containers of mapped images running as processes (programs.go).
type runtimeService struct {
	*fake.RemoteRuntime
	programs *programs
}

func (r runtimeService) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	response, err := r.RemoteRuntime.RunPodSandbox(ctx, req)
	if err != nil || r.programs == nil ||
		req.GetConfig().GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		return response, err
	}
	ip, err := r.programs.setUpNetwork(response.PodSandboxId)
	if err != nil {
		_, _ = r.RemoteRuntime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: response.PodSandboxId})
		return nil, fmt.Errorf("the network of pod %s/%s: %v", req.GetConfig().GetMetadata().GetNamespace(),
			req.GetConfig().GetMetadata().GetName(), err)
	}
	service := r.RemoteRuntime.RuntimeService
	service.Lock()
	if sandbox, ok := service.Sandboxes[response.PodSandboxId]; ok {
		sandbox.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: ip}
	}
	service.Unlock()
	return response, nil
}

func (r runtimeService) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	if r.programs != nil {
		for _, id := range r.containersOf(req.PodSandboxId) {
			r.programs.stop(ctx, id, 0)
		}
		r.programs.tearDownNetwork(req.PodSandboxId)
	}
	return r.RemoteRuntime.StopPodSandbox(ctx, req)
}

func (r runtimeService) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if r.programs != nil {
		r.programs.tearDownNetwork(req.PodSandboxId)
	}
	return r.RemoteRuntime.RemovePodSandbox(ctx, req)
}

func (r runtimeService) containersOf(sandbox string) []string {
	service := r.RemoteRuntime.RuntimeService
	service.Lock()
	defer service.Unlock()
	ids := []string{}
	for id, container := range service.Containers {
		if container.SandboxID == sandbox {
			ids = append(ids, id)
		}
	}
	return ids
}

func (r runtimeService) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
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
	if r.programs != nil {
		if program := r.programs.programOf(req.GetConfig().GetImage().GetImage()); program != "" {
			logPath := ""
			if req.GetConfig().GetLogPath() != "" {
				logPath = filepath.Join(req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath())
			}
			r.programs.created(response.ContainerId, &createdInfo{sandbox: req.PodSandboxId, program: program,
				config: req.GetConfig(), logPath: logPath})
		}
	}
	return response, nil
}

func (r runtimeService) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	response, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil || r.programs == nil {
		return response, err
	}
	info := r.programs.info(req.ContainerId)
	if info == nil {
		return response, nil
	}
	service := r.RemoteRuntime.RuntimeService
	ended := func(code int32, reason string) {
		service.Lock()
		defer service.Unlock()
		if container, ok := service.Containers[req.ContainerId]; ok {
			container.State = runtimeapi.ContainerState_CONTAINER_EXITED
			container.FinishedAt = time.Now().UnixNano()
			container.ExitCode = code
			container.Reason = reason
		}
	}
	if err := r.programs.start(req.ContainerId, info, ended); err != nil {
		ended(128, "StartError")
		return nil, fmt.Errorf("container %s: %v", req.ContainerId, err)
	}
	return response, nil
}

func (r runtimeService) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if r.programs != nil {
		r.programs.stop(ctx, req.ContainerId, req.Timeout)
	}
	return r.RemoteRuntime.StopContainer(ctx, req)
}

func (r runtimeService) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	if r.programs != nil {
		r.programs.stop(ctx, req.ContainerId, 0)
		r.programs.forget(req.ContainerId)
	}
	return r.RemoteRuntime.RemoveContainer(ctx, req)
}

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/cri.sock to serve on")
	var options programOptions
	flag.StringVar(&options.file, "programs", "", "a file of IMAGE PROGRAM lines: those images' containers run PROGRAM")
	flag.StringVar(&options.subnet, "pod-subnet", "", "with --programs: the pods' addresses, SUBNET.2 to SUBNET.254 (e.g. 10.88.3)")
	flag.StringVar(&options.apiserver, "apiserver", "", "with --programs: kube-apiserver's host:port, forwarded into each pod")
	flag.StringVar(&options.kubeletPids, "kubelet-pids", "", "with --programs: the node's pids file (its kubelet line)")
	flag.Parse()
	if *endpoint == "" || flag.NArg() != 0 || (options.file != "" &&
		(options.subnet == "" || options.apiserver == "" || options.kubeletPids == "")) {
		fmt.Fprintln(os.Stderr, "usage: cri-runtime --endpoint unix:///path/to/cri.sock "+
			"[--programs FILE --pod-subnet A.B.C --apiserver HOST:PORT --kubelet-pids FILE]")
		os.Exit(2)
	}
	var programs *programs
	if options.file != "" {
		var err error
		if programs, err = loadPrograms(options); err != nil {
			fmt.Fprintf(os.Stderr, "cri-runtime: --programs: %v\n", err)
			os.Exit(2)
		}
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
	// As fake.RemoteRuntime.Start, with runtimeService in its place.
	listener, err := util.CreateListener(*endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-runtime: listening on %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, runtimeService{runtime, programs})
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
	if programs != nil {
		programs.shutdown()
	}
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

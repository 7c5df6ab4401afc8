// gpu-device-plugin advertises a host's GPUs to kubelet the way KubeVirt's GPU device plugins
// do, reading a sysfs tree (a fixture host that gpu-fixture built, or "/"): one resource per PCI
// device model for vfio-bound functions, one per mdev type. Test tooling of scripts/cluster.sh
// `node` (docs/testing.md, "Real nodes"), never shipped.
//
//	gpu-device-plugin --sysfs-root ROOT --plugin-dir DIR [--ids address|iommu-group]
//	                  [--unhealthy-file FILE] [--pci-ids FILE]
//
// IDs, as the plugins name them (../shared/research/device-ids.md, sections 3 and 4):
//   - address (NVIDIA's kubevirt-gpu-device-plugin 1.5 and later): a function's PCI address, an
//     mdev's UUID;
//   - iommu-group (KubeVirt's own PCI and mdev plugins): the IOMMU group number of the function,
//     or of the mdev.
//
// Resource names as NVIDIA's plugin makes them: `<vendor domain>/<pci.ids device name>`,
// upper-cased, `/` `.` and blanks as `_`, nothing but letters, digits, `_` and `.` kept
// (`nvidia.com/GA100_A100_PCIE_40GB`); the hex device ID when pci.ids does not know it; for an
// mdev its type's name with blanks as `_` (`nvidia.com/GRID_T4-2Q`).
//
// Health: each ID listed in the unhealthy file (one per line) is advertised Unhealthy; the
// file is read again on SIGHUP and every 250 ms. The plugin registers again whenever its socket
// is gone (kubelet removes the plugin sockets when it starts), as KubeVirt's plugins do.
// Allocate answers PCI_RESOURCE_<NAME> (PCI addresses) or MDEV_PCI_RESOURCE_<NAME> (mdev UUIDs),
// as virt-launcher reads them.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// device is one advertised ID and what Allocate hands out for it.
type device struct {
	id       string
	numa     int64    // -1: none
	env      []string // PCI addresses or mdev UUIDs
	isMdev   bool
	resource string
}

type resource struct {
	name    string
	devices []*device
}

var vendorDomains = map[string]string{"10de": "nvidia.com", "1002": "amd.com", "8086": "intel.com"}

func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

func hexID(path string) string {
	return strings.ToLower(strings.TrimPrefix(readTrimmed(path), "0x"))
}

func linkBase(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

func numaOf(dir string) int64 {
	n, err := strconv.ParseInt(readTrimmed(filepath.Join(dir, "numa_node")), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// pciNames reads a pci.ids file: device names by "vendor:device".
func pciNames(path string) map[string]string {
	names := map[string]string{}
	file, err := os.Open(path)
	if err != nil {
		return names
	}
	defer file.Close()
	scanner := bufio.NewScanner(file)
	vendor := ""
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || line[0] == '#' || strings.HasPrefix(line, "\t\t") {
			continue
		}
		if line[0] != '\t' {
			vendor = ""
			if len(line) > 4 && line[4] == ' ' {
				vendor = strings.ToLower(line[:4])
			}
			continue
		}
		if vendor != "" && len(line) > 6 {
			names[vendor+":"+strings.ToLower(line[1:5])] = strings.TrimSpace(line[5:])
		}
	}
	return names
}

var (
	blanks      = regexp.MustCompile(`\s+`)
	notNameChar = regexp.MustCompile(`[^A-Za-z0-9_.]`)
)

func resourceSuffix(name string) string {
	name = strings.ToUpper(name)
	name = strings.NewReplacer("/", "_", ".", "_").Replace(name)
	name = blanks.ReplaceAllString(name, "_")
	return notNameChar.ReplaceAllString(name, "")
}

func envName(prefix, resourceName string) string {
	return prefix + strings.ToUpper(strings.NewReplacer("/", "_", ".", "_").Replace(resourceName))
}

// discover reads the tree: vfio-bound functions of GPU vendors by model, mdevs by type.
func discover(root, ids string, names map[string]string) ([]*resource, error) {
	byName := map[string]*resource{}
	byID := map[string]*device{}
	add := func(resourceName, id string, numa int64, env string, isMdev bool) {
		r := byName[resourceName]
		if r == nil {
			r = &resource{name: resourceName}
			byName[resourceName] = r
		}
		key := resourceName + "\x00" + id
		if d := byID[key]; d != nil { // one IOMMU group, several functions
			d.env = append(d.env, env)
			return
		}
		d := &device{id: id, numa: numa, env: []string{env}, isMdev: isMdev, resource: resourceName}
		byID[key] = d
		r.devices = append(r.devices, d)
	}
	pciDir := filepath.Join(root, "sys/bus/pci/devices")
	entries, err := os.ReadDir(pciDir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", pciDir, err)
	}
	for _, entry := range entries {
		dir := filepath.Join(pciDir, entry.Name())
		vendor := hexID(filepath.Join(dir, "vendor"))
		domain, gpuVendor := vendorDomains[vendor]
		driver := linkBase(filepath.Join(dir, "driver"))
		if !gpuVendor || (driver != "vfio-pci" && driver != "nvgrace_gpu_vfio_pci") {
			continue
		}
		model := hexID(filepath.Join(dir, "device"))
		suffix := model
		if name, ok := names[vendor+":"+model]; ok {
			suffix = resourceSuffix(name)
		}
		id := entry.Name()
		if ids == "iommu-group" {
			if id = linkBase(filepath.Join(dir, "iommu_group")); id == "" {
				continue // no IOMMU: KubeVirt's plugin cannot hand it out
			}
		}
		add(domain+"/"+suffix, id, numaOf(dir), entry.Name(), false)
	}
	mdevDir := filepath.Join(root, "sys/bus/mdev/devices")
	mdevs, _ := os.ReadDir(mdevDir)
	for _, entry := range mdevs {
		dir := filepath.Join(mdevDir, entry.Name())
		typeName := readTrimmed(filepath.Join(dir, "mdev_type/name"))
		if typeName == "" {
			typeName = linkBase(filepath.Join(dir, "mdev_type"))
		}
		target, err := filepath.EvalSymlinks(dir)
		if err != nil || typeName == "" {
			continue
		}
		parent := filepath.Dir(target)
		domain, ok := vendorDomains[hexID(filepath.Join(parent, "vendor"))]
		if !ok {
			domain = "nvidia.com"
		}
		id := entry.Name()
		if ids == "iommu-group" {
			if id = linkBase(filepath.Join(dir, "iommu_group")); id == "" {
				continue
			}
		}
		add(domain+"/"+blanks.ReplaceAllString(typeName, "_"), id, numaOf(parent), entry.Name(), true)
	}
	var out []*resource
	for _, r := range byName {
		sort.Slice(r.devices, func(i, j int) bool { return r.devices[i].id < r.devices[j].id })
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// health: the IDs listed unhealthy, and who waits for a change.
type health struct {
	mu        sync.Mutex
	file      string
	unhealthy map[string]bool
	changed   chan struct{} // closed and replaced on each change
}

func (h *health) reload() {
	next := map[string]bool{}
	if h.file != "" {
		if data, err := os.ReadFile(h.file); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if line = strings.TrimSpace(line); line != "" {
					next[line] = true
				}
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	same := len(next) == len(h.unhealthy)
	for id := range next {
		same = same && h.unhealthy[id]
	}
	if same {
		return
	}
	h.unhealthy = next
	close(h.changed)
	h.changed = make(chan struct{})
	ids := make([]string, 0, len(next))
	for id := range next {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	fmt.Fprintf(os.Stderr, "gpu-device-plugin: unhealthy now: [%s]\n", strings.Join(ids, " "))
}

func (h *health) snapshot() (map[string]bool, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unhealthy, h.changed
}

// plugin serves one resource on its own socket.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	res    *resource
	health *health
	socket string
	server *grpc.Server
	stop   chan struct{}
}

func (p *plugin) list() *pluginapi.ListAndWatchResponse {
	unhealthy, _ := p.health.snapshot()
	resp := &pluginapi.ListAndWatchResponse{}
	for _, d := range p.res.devices {
		state := pluginapi.Healthy
		if unhealthy[d.id] {
			state = pluginapi.Unhealthy
		}
		dev := &pluginapi.Device{ID: d.id, Health: state}
		if d.numa >= 0 {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: d.numa}}}
		}
		resp.Devices = append(resp.Devices, dev)
	}
	return resp
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		_, changed := p.health.snapshot()
		if err := stream.Send(p.list()); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-p.stop:
			// As KubeVirt's plugins: an empty list on the way out, so kubelet drops the devices.
			_ = stream.Send(&pluginapi.ListAndWatchResponse{})
			return nil
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	byID := map[string]*device{}
	for _, d := range p.res.devices {
		byID[d.id] = d
	}
	resp := &pluginapi.AllocateResponse{}
	for _, container := range req.ContainerRequests {
		var values []string
		isMdev := false
		for _, id := range container.DevicesIds {
			d, ok := byID[id]
			if !ok {
				return nil, fmt.Errorf("no device %q in %s", id, p.res.name)
			}
			values = append(values, d.env...)
			isMdev = d.isMdev
		}
		prefix := "PCI_RESOURCE_"
		if isMdev {
			prefix = "MDEV_PCI_RESOURCE_"
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{envName(prefix, p.res.name): strings.Join(values, ",")},
		})
	}
	fmt.Fprintf(os.Stderr, "gpu-device-plugin: allocated %s\n", p.res.name)
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) start() error {
	_ = os.Remove(p.socket)
	listener, err := net.Listen("unix", p.socket)
	if err != nil {
		return err
	}
	p.stop = make(chan struct{})
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(listener) }()
	return nil
}

func (p *plugin) halt() {
	if p.server == nil {
		return
	}
	close(p.stop)
	time.Sleep(50 * time.Millisecond) // the empty list goes out first
	p.server.Stop()
	p.server = nil
}

func register(kubeletSocket string, p *plugin) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.res.name,
	})
	return err
}

func main() {
	root := flag.String("sysfs-root", "/", "the root holding sys/ (a fixture host, or /)")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "kubelet's device-plugin directory")
	ids := flag.String("ids", "address", "device IDs: address (PCI address, mdev UUID) or iommu-group")
	unhealthyFile := flag.String("unhealthy-file", "", "a file listing the IDs to advertise Unhealthy")
	pciIDs := flag.String("pci-ids", "/usr/share/misc/pci.ids", "pci.ids, for resource names")
	flag.Parse()
	if flag.NArg() != 0 || (*ids != "address" && *ids != "iommu-group") {
		fmt.Fprintln(os.Stderr, "usage: gpu-device-plugin --sysfs-root ROOT --plugin-dir DIR "+
			"[--ids address|iommu-group] [--unhealthy-file FILE] [--pci-ids FILE]")
		os.Exit(2)
	}
	resources, err := discover(*root, *ids, pciNames(*pciIDs))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-device-plugin: %v\n", err)
		os.Exit(1)
	}
	h := &health{file: *unhealthyFile, changed: make(chan struct{})}
	h.reload()
	var plugins []*plugin
	for _, r := range resources {
		var listed []string
		for _, d := range r.devices {
			listed = append(listed, d.id)
		}
		fmt.Fprintf(os.Stderr, "gpu-device-plugin: %s: %s\n", r.name, strings.Join(listed, " "))
		plugins = append(plugins, &plugin{res: r, health: h,
			socket: filepath.Join(*dir, "cozy-"+strings.ReplaceAll(r.name, "/", "-")+".sock")})
	}
	if len(plugins) == 0 {
		fmt.Fprintf(os.Stderr, "gpu-device-plugin: no vfio-bound GPU function or mdev under %s\n", *root)
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	kubeletSocket := filepath.Join(*dir, "kubelet.sock")
	registered := map[*plugin]bool{}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, p := range plugins {
			// kubelet removes every plugin socket when it starts: serve and register again.
			if _, err := os.Stat(p.socket); errors.Is(err, os.ErrNotExist) || !registered[p] {
				if registered[p] {
					fmt.Fprintf(os.Stderr, "gpu-device-plugin: %s: socket gone (kubelet restarted?); registering again\n", p.res.name)
				}
				registered[p] = false
				p.halt()
				if err := p.start(); err != nil {
					fmt.Fprintf(os.Stderr, "gpu-device-plugin: %s: %v\n", p.res.name, err)
					continue
				}
				if err := register(kubeletSocket, p); err != nil {
					p.halt()
					continue // kubelet not there yet: the next tick tries again
				}
				registered[p] = true
				fmt.Fprintf(os.Stderr, "gpu-device-plugin: %s: registered\n", p.res.name)
			}
		}
		select {
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				h.reload()
				continue
			}
			for _, p := range plugins {
				p.halt()
				_ = os.Remove(p.socket)
			}
			return
		case <-tick.C:
			h.reload()
		}
	}
}

package main

// Programs: with --programs, a container whose image the file maps to a host program runs that
// program as a process of its own (the chart's gpu-controller, say, in its Deployment's pods), so
// kubelet, kube-scheduler and kube-controller-manager roll, probe and stop real replicas. Each pod
// of such a node gets a network namespace with an address of its own (the node's --pod-subnet),
// reached from the host through a veth pair, as a CNI plugin would give it: kubelet's probes and
// kube-apiserver (with --enable-aggregator-routing, a Service's endpoints) reach it there. There
// is no kube-proxy: inside the pod, 127.0.0.1 on the API server's port forwards to the API
// server, and KUBERNETES_SERVICE_HOST/PORT say so. The container's process runs in the kubelet's
// mount namespace (where its volumes are mounted) and then one of its own, with each of the
// request's mounts bound at its container path, the root read-only where the pod asks, as the
// user and group it asks for, with no new privileges where it asks. A stop is SIGTERM, then
// SIGKILL after the grace; the exit code is the container's.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type programOptions struct {
	file        string // IMAGE PROGRAM lines
	subnet      string // the pods' addresses: SUBNET.2 to SUBNET.254, e.g. 10.88.3
	apiserver   string // host:port of kube-apiserver, on the host
	kubeletPids string // the node's pids file: its last "kubelet PID" line names the kubelet
}

type podNetwork struct {
	netns    string // /run/netns/NAME
	name     string
	ip       string
	listener net.Listener
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

type programs struct {
	options  programOptions
	images   map[string]string // image -> a copy of its program in dir
	original map[string]string // the copy -> the program it copies
	dir      string
	mu       sync.Mutex
	next     int
	networks map[string]*podNetwork  // sandbox ID -> its network
	configs  map[string]*createdInfo // container ID -> what it runs
	running  map[string]*process     // container ID -> its process
}

type createdInfo struct {
	sandbox string
	program string
	config  *runtimeapi.ContainerConfig
	logPath string
}

// loadPrograms reads the file and copies each program where any user may run it (a pod asks for
// a user of its own; the build directory may be one only root enters).
func loadPrograms(options programOptions) (*programs, error) {
	p := &programs{options: options, images: map[string]string{}, original: map[string]string{}, networks: map[string]*podNetwork{},
		configs: map[string]*createdInfo{}, running: map[string]*process{}}
	data, err := os.ReadFile(options.file)
	if err != nil {
		return nil, err
	}
	p.dir, err = os.MkdirTemp("", "cozy-programs.")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(p.dir, 0o755); err != nil {
		return nil, err
	}
	for n, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: not IMAGE PROGRAM", options.file, n+1)
		}
		copyPath := filepath.Join(p.dir, fmt.Sprintf("%d-%s", n+1, filepath.Base(fields[1])))
		if err := copyFile(fields[1], copyPath); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", options.file, n+1, err)
		}
		p.images[fields[0]] = copyPath
		p.original[copyPath] = fields[1]
	}
	return p, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setUpNetwork gives a sandbox its namespace, address and the API server's forward; its IP.
func (p *programs) setUpNetwork(sandbox string) (string, error) {
	p.mu.Lock()
	p.next++
	n := p.next
	p.mu.Unlock()
	if n > 253 {
		return "", fmt.Errorf("no pod address left in %s.0/24", p.options.subnet)
	}
	last := p.options.subnet[strings.LastIndex(p.options.subnet, ".")+1:]
	name := fmt.Sprintf("cozy-%s-%d", last, n)
	ip := fmt.Sprintf("%s.%d", p.options.subnet, n+1)
	veth := fmt.Sprintf("cz%sh%d", last, n)
	steps := [][]string{
		{"ip", "netns", "add", name},
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name},
		// The pod's gateway is the host's end of its pair: the host answers there, and reaches
		// the pod from there.
		{"ip", "addr", "add", "169.254.1.1/32", "dev", veth},
		{"ip", "link", "set", veth, "up"},
		{"ip", "route", "add", ip + "/32", "dev", veth},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "addr", "add", ip + "/32", "dev", "eth0"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "route", "add", "169.254.1.1", "dev", "eth0"},
		{"ip", "-n", name, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0"},
	}
	network := &podNetwork{netns: "/run/netns/" + name, name: name, ip: ip}
	for _, step := range steps {
		if err := run(step...); err != nil {
			_ = run("ip", "netns", "del", name)
			return "", err
		}
	}
	listener, err := listenIn(network.netns, "127.0.0.1:"+portOf(p.options.apiserver))
	if err != nil {
		_ = run("ip", "netns", "del", name)
		return "", err
	}
	network.listener = listener
	go forward(listener, p.options.apiserver)
	p.mu.Lock()
	p.networks[sandbox] = network
	p.mu.Unlock()
	fmt.Fprintf(os.Stderr, "cri-runtime: sandbox %s: network namespace %s, %s\n", sandbox, name, ip)
	return ip, nil
}

func portOf(hostPort string) string {
	_, port, _ := net.SplitHostPort(hostPort)
	return port
}

// listenIn listens on addr inside the network namespace at nsPath. The namespace is entered on a
// goroutine of its own, locked to its thread, which is unlocked only once back in the host's
// namespace: a thread that could not return ends with that goroutine instead of going back to
// Go's pool.
func listenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		listener net.Listener
		err      error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		listener, stranded, err := listenLocked(nsPath, addr)
		if !stranded {
			runtime.UnlockOSThread()
		}
		done <- result{listener, err}
	}()
	r := <-done
	return r.listener, r.err
}

// listenLocked is listenIn on a thread locked to the calling goroutine; stranded: the thread is
// still in the pod's namespace.
func listenLocked(nsPath, addr string) (listener net.Listener, stranded bool, err error) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, false, err
	}
	defer own.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, false, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, false, fmt.Errorf("setns %s: %v", nsPath, err)
	}
	listener, err = net.Listen("tcp", addr)
	return listener, unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) != nil, err
}

// forward copies each connection accepted to one dialled to `to` (on the host), both ways.
func forward(listener net.Listener, to string) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			upstream, err := net.DialTimeout("tcp", to, 5*time.Second)
			if err != nil {
				return
			}
			defer upstream.Close()
			go func() { _, _ = io.Copy(upstream, conn); upstream.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(conn, upstream)
		}()
	}
}

func (p *programs) tearDownNetwork(sandbox string) {
	p.mu.Lock()
	network := p.networks[sandbox]
	delete(p.networks, sandbox)
	p.mu.Unlock()
	if network == nil {
		return
	}
	network.listener.Close()
	if err := run("ip", "netns", "del", network.name); err != nil {
		fmt.Fprintf(os.Stderr, "cri-runtime: %v\n", err)
	}
}

func (p *programs) networkOf(sandbox string) *podNetwork {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.networks[sandbox]
}

// kubeletMountNamespace: the kubelet's, where the pods' volumes are mounted.
func (p *programs) kubeletMountNamespace() (string, error) {
	data, err := os.ReadFile(p.options.kubeletPids)
	if err != nil {
		return "", err
	}
	pid := ""
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) == 2 && fields[0] == "kubelet" {
			pid = fields[1]
		}
	}
	if pid == "" {
		return "", fmt.Errorf("%s names no kubelet", p.options.kubeletPids)
	}
	return "/proc/" + pid + "/ns/mnt", nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// command builds what runs a container: nsenter into the kubelet's mount namespace and the pod's
// network, unshare a mount namespace of its own, bind the mounts, then the program as the user
// the pod asks for.
func (p *programs) command(info *createdInfo, network *podNetwork) (*exec.Cmd, error) {
	mountNs, err := p.kubeletMountNamespace()
	if err != nil {
		return nil, err
	}
	config := info.config
	script := []string{"set -e"}
	for _, m := range config.GetMounts() {
		target := m.GetContainerPath()
		if strings.HasPrefix(target, "/dev/") || strings.HasPrefix(target, "/proc/") || strings.HasPrefix(target, "/sys/") {
			continue // devices and kernel files are the host's here
		}
		source := m.GetHostPath()
		// A directory's mount point is made as one, a file's as an empty file (tested in the
		// kubelet's mount namespace, where a volume's files are).
		script = append(script, fmt.Sprintf("if [ -d %[1]s ]; then mkdir -p %[2]s; else mkdir -p \"$(dirname %[2]s)\"; [ -e %[2]s ] || : > %[2]s; fi",
			shellQuote(source), shellQuote(target)))
		script = append(script, fmt.Sprintf("mount --bind %s %s", shellQuote(source), shellQuote(target)))
		if m.GetReadonly() {
			script = append(script, fmt.Sprintf("mount -o remount,bind,ro %s", shellQuote(target)))
		}
	}
	security := config.GetLinux().GetSecurityContext()
	if security.GetReadonlyRootfs() {
		script = append(script, "mount -o remount,bind,ro /") // this namespace's copy of the root mount
	}
	exec_ := []string{"exec"}
	if uid := security.GetRunAsUser(); uid != nil {
		gid := uid.GetValue()
		if g := security.GetRunAsGroup(); g != nil {
			gid = g.GetValue()
		}
		exec_ = append(exec_, "setpriv", fmt.Sprintf("--reuid=%d", uid.GetValue()),
			fmt.Sprintf("--regid=%d", gid), "--clear-groups")
		if security.GetNoNewPrivs() {
			exec_ = append(exec_, "--no-new-privs")
		}
	}
	exec_ = append(exec_, `"$@"`)
	script = append(script, strings.Join(exec_, " "))
	argv := []string{info.program}
	if len(config.GetCommand()) > 1 {
		argv = append(argv, config.GetCommand()[1:]...)
	}
	argv = append(argv, config.GetArgs()...)
	args := []string{"--mount=" + mountNs}
	if network != nil {
		args = append(args, "--net="+network.netns)
	}
	args = append(args, "--", "unshare", "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", strings.Join(script, "\n"), "container")
	args = append(args, argv...)
	cmd := exec.Command("nsenter", args...)
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	// A sanitized build's options (the suite's ASan pass) reach its programs in pods too.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasSuffix(name, "SAN_OPTIONS") {
			env = append(env, kv)
		}
	}
	for _, kv := range config.GetEnvs() {
		// The kubernetes Service's variables name its cluster IP, which nothing routes here.
		if network != nil && (strings.HasPrefix(kv.GetKey(), "KUBERNETES_SERVICE_") || strings.HasPrefix(kv.GetKey(), "KUBERNETES_PORT")) {
			continue
		}
		env = append(env, kv.GetKey()+"="+string(kv.GetValue()))
	}
	if network != nil {
		env = append(env, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+portOf(p.options.apiserver))
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// criLog copies a stream into the container's log in the CRI format kubelet reads.
func criLog(r io.Reader, w io.Writer, mu *sync.Mutex, stream string) {
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		mu.Lock()
		fmt.Fprintf(w, "%s %s F %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, scanner.Text())
		mu.Unlock()
	}
}

// start runs the container's program; onExit gets its exit code when it ends.
func (p *programs) start(id string, info *createdInfo, onExit func(code int32, reason string)) error {
	cmd, err := p.command(info, p.networkOf(info.sandbox))
	if err != nil {
		return err
	}
	var logFile io.WriteCloser = nopCloser{io.Discard}
	if info.logPath != "" {
		if f, err := os.OpenFile(info.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640); err == nil {
			logFile = f
		}
	}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return err
	}
	proc := &process{cmd: cmd, done: make(chan struct{})}
	p.mu.Lock()
	p.running[id] = proc
	p.mu.Unlock()
	fmt.Fprintf(os.Stderr, "cri-runtime: container %s: %s started, pid %d\n", id, p.original[info.program], cmd.Process.Pid)
	var logMu sync.Mutex
	var copying sync.WaitGroup
	copying.Add(2)
	go func() { defer copying.Done(); criLog(stdout, logFile, &logMu, "stdout") }()
	go func() { defer copying.Done(); criLog(stderr, logFile, &logMu, "stderr") }()
	go func() {
		copying.Wait()
		err := cmd.Wait()
		logFile.Close()
		code, reason := int32(0), "Completed"
		if exit, ok := err.(*exec.ExitError); ok {
			status := exit.Sys().(syscall.WaitStatus)
			code, reason = int32(exit.ExitCode()), "Error"
			if status.Signaled() {
				code = 128 + int32(status.Signal())
			}
		} else if err != nil {
			code, reason = 128, "Error"
		}
		fmt.Fprintf(os.Stderr, "cri-runtime: container %s exited %d\n", id, code)
		onExit(code, reason)
		close(proc.done)
	}()
	return nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// stop: SIGTERM, then SIGKILL after timeout seconds; returns once it has ended.
func (p *programs) stop(ctx context.Context, id string, timeout int64) {
	p.mu.Lock()
	proc := p.running[id]
	p.mu.Unlock()
	if proc == nil {
		return
	}
	_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-proc.done:
		return
	case <-time.After(time.Duration(timeout) * time.Second):
	case <-ctx.Done():
	}
	_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGKILL)
	<-proc.done
}

// programOf: the program an image runs, or "" (the image as written, or as kubelet normalized it).
func (p *programs) programOf(image string) string {
	for _, name := range []string{image, strings.TrimPrefix(image, "docker.io/"), strings.TrimPrefix(image, "docker.io/library/")} {
		if program, ok := p.images[name]; ok {
			return program
		}
	}
	return ""
}

func (p *programs) created(id string, info *createdInfo) {
	p.mu.Lock()
	p.configs[id] = info
	p.mu.Unlock()
}

func (p *programs) info(id string) *createdInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.configs[id]
}

func (p *programs) forget(id string) {
	p.mu.Lock()
	delete(p.running, id)
	delete(p.configs, id)
	p.mu.Unlock()
}

// shutdown ends every program and removes every network and the programs' copies.
func (p *programs) shutdown() {
	p.mu.Lock()
	ids := []string{}
	for id := range p.running {
		ids = append(ids, id)
	}
	sandboxes := []string{}
	for id := range p.networks {
		sandboxes = append(sandboxes, id)
	}
	p.mu.Unlock()
	var stopping sync.WaitGroup
	for _, id := range ids {
		stopping.Add(1)
		go func() { defer stopping.Done(); p.stop(context.Background(), id, 3) }()
	}
	stopping.Wait()
	for _, id := range sandboxes {
		p.tearDownNetwork(id)
	}
	os.RemoveAll(p.dir)
}

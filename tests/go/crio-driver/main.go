// crio-driver replays, on libcni v1.3.1, the CNI calls CRI-O makes through its ocicni library
// (github.com/cri-o/ocicni pkg/ocicni, CRI-O's server/sandbox_network.go, server/server.go and
// internal/config/cnimgr), read from their sources of August 2026. It is our own test driver,
// not CRI-O: CRI-O is not served by the Go module registry these machines reach, so the real
// daemon cannot be built here. Each phase is one process, so a "restart" is simply a new
// process reading the state file (the sandboxes CRI-O knows) and the libcni cache.
//
//	crio-driver [flags] start               start-up: STATUS of the default network every 500 ms
//	                                        until it succeeds; CHECK + cached result of every
//	                                        known pod (a failure is a warning); then GC once of
//	                                        every network, the known pods as valid attachments
//	crio-driver [flags] run-pod ID NETNS [INGRESS_BPS EGRESS_BPS]
//	                                        RunPodSandbox: lo up, ADD of the list, then CHECK of
//	                                        the list + cached result; if either fails, DEL and
//	                                        exit 1; else the pod is recorded in the state file
//	crio-driver [flags] stop-pod ID         StopPodSandbox: DEL with the cached config
//	crio-driver [flags] forget ID           the runtime loses a pod without DEL (its cache entry
//	                                        becomes stale)
//	crio-driver [flags] status N INTERVAL   the cni_status_grace_period monitor: N STATUS calls
//
// Every libcni call and its outcome is printed on stdout as one JSON object per line. With
// -traceparent (and -tracestate) every libcni call runs under that span context, which libcni
// passes to the plugins as TRACEPARENT/TRACESTATE (tests/e2e/trace.rs).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

type pod struct {
	ID        string `json:"id"`
	NetNS     string `json:"netns"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	Ingress   uint64 `json:"ingress,omitempty"`
	Egress    uint64 `json:"egress,omitempty"`
}

type state struct {
	Pods []pod `json:"pods"`
}

type event struct {
	Op    string `json:"op"`
	Net   string `json:"net,omitempty"`
	ID    string `json:"id,omitempty"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Valid: the attachments a GC kept (GC only).
	Valid []types.GCAttachment `json:"valid,omitempty"`
	Note  string               `json:"note,omitempty"`
}

var (
	confDir  = flag.String("confdir", "/etc/cni/net.d", "CNI config directory")
	binDir   = flag.String("bindir", "/opt/cni/bin", "CNI plugin directories, colon-separated")
	cacheDir = flag.String("cachedir", "/var/lib/cni", "libcni cache directory")
	stateF   = flag.String("state", "", "file of the pods the runtime knows (JSON)")
	netName  = flag.String("net", "", "default network (CRI-O's cni_default_network); empty = first config file")
	callSecs = flag.Int("call-timeout", 60, "seconds any one libcni call may take")
	waitSecs = flag.Int("status-wait", 30, "seconds start-up waits for STATUS to succeed")
	// the span context every libcni call runs under (W3C traceparent / tracestate); none if empty
	traceParent = flag.String("traceparent", "", "span context of every libcni call (W3C traceparent)")
	traceState  = flag.String("tracestate", "", "its W3C tracestate")
)

func emit(e event) {
	b, _ := json.Marshal(e)
	fmt.Println(string(b))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "crio-driver: "+format+"\n", a...)
	os.Exit(2)
}

// loadNetworks does what ocicni's loadNetworks does: every .conf/.conflist/.json file of the
// config directory, sorted by name, the first one being the default network unless named.
func loadNetworks() (map[string]*libcni.NetworkConfigList, *libcni.NetworkConfigList) {
	files, err := libcni.ConfFiles(*confDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		die("reading %s: %v", *confDir, err)
	}
	sort.Strings(files)
	nets := map[string]*libcni.NetworkConfigList{}
	var first *libcni.NetworkConfigList
	for _, f := range files {
		var list *libcni.NetworkConfigList
		if strings.HasSuffix(f, ".conflist") {
			list, err = libcni.NetworkConfFromFile(f)
		} else {
			var conf *libcni.PluginConfig
			if conf, err = libcni.ConfFromFile(f); err == nil {
				list, err = libcni.ConfListFromConf(conf)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "crio-driver: skipping %s: %v\n", f, err)
			continue
		}
		if _, dup := nets[list.Name]; dup {
			continue
		}
		nets[list.Name] = list
		if first == nil {
			first = list
		}
	}
	if *netName != "" {
		first = nets[*netName]
	}
	if first == nil {
		die("no default network in %s", *confDir)
	}
	return nets, first
}

func loadState() *state {
	s := &state{}
	b, err := os.ReadFile(*stateF)
	if errors.Is(err, os.ErrNotExist) {
		return s
	} else if err != nil {
		die("state: %v", err)
	}
	if err := json.Unmarshal(b, s); err != nil {
		die("state %s: %v", *stateF, err)
	}
	return s
}

func (s *state) save() {
	b, _ := json.MarshalIndent(s, "", "  ")
	tmp := *stateF + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		die("state: %v", err)
	}
	if err := os.Rename(tmp, *stateF); err != nil {
		die("state: %v", err)
	}
}

// runtimeConf is ocicni's buildCNIRuntimeConf for CRI-O's pod network: the K8S_* args, and as
// capability args the bandwidth (CRI-O's burst for "no limit" is MaxUint32*8-1 bits), the
// cgroup parent and the pod annotations. CRI-O does host ports itself (its hostport manager),
// so it passes no portMappings.
func runtimeConf(p pod) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: p.ID,
		NetNS:       p.NetNS,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", p.Namespace},
			{"K8S_POD_NAME", p.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ID},
			{"K8S_POD_UID", p.UID},
		},
		CapabilityArgs: map[string]any{},
	}
	if p.Ingress > 0 || p.Egress > 0 {
		bw := map[string]uint64{}
		if p.Ingress > 0 {
			bw["ingressRate"] = p.Ingress
			bw["ingressBurst"] = math.MaxUint32*8 - 1
		}
		if p.Egress > 0 {
			bw["egressRate"] = p.Egress
			bw["egressBurst"] = math.MaxUint32*8 - 1
		}
		// ocicni always sends all four keys
		for _, k := range []string{"ingressRate", "ingressBurst", "egressRate", "egressBurst"} {
			if _, ok := bw[k]; !ok {
				bw[k] = 0
			}
		}
		rt.CapabilityArgs["bandwidth"] = bw
	}
	rt.CapabilityArgs["cgroupPath"] = "/kubepods/pod" + p.UID
	rt.CapabilityArgs["io.kubernetes.cri.pod-annotations"] = map[string]string{"io.kubernetes.pod.name": p.Name}
	return rt
}

// ctx is the context of one libcni call. With -traceparent it carries that span context (as
// CRI-O's contexts carry its OpenTelemetry spans), which libcni 1.3.1 hands to every plugin it
// execs as TRACEPARENT/TRACESTATE (pkg/invoke/raw_exec.go, injectTraceContext).
func ctx(secs int) (context.Context, context.CancelFunc) {
	c := context.Background()
	if *traceParent != "" {
		carrier := propagation.MapCarrier{"traceparent": *traceParent, "tracestate": *traceState}
		c = propagation.TraceContext{}.Extract(c, carrier)
		if !trace.SpanContextFromContext(c).IsValid() {
			die("-traceparent %q is not a valid W3C traceparent", *traceParent)
		}
	}
	return context.WithTimeout(c, time.Duration(secs)*time.Second)
}

// fromCache is ocicni's loadNetworkFromCache: CHECK and DEL use the config and runtime conf
// libcni cached at ADD, falling back to the network on disk.
func fromCache(cni *libcni.CNIConfig, def *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (*libcni.NetworkConfigList, *libcni.RuntimeConf) {
	bytes, cachedRt, err := cni.GetNetworkListCachedConfig(&libcni.NetworkConfigList{Name: def.Name}, rt)
	if err == nil && bytes != nil {
		if list, err := libcni.NetworkConfFromBytes(bytes); err == nil && len(list.Plugins) > 0 {
			return list, cachedRt
		}
	}
	return def, rt
}

// podStatus is ocicni's GetPodNetworkStatus as CRI-O calls it: lo must be up, then CHECK of the
// list (configs >= 0.4.0) and the cached result, which must exist.
func podStatus(cni *libcni.CNIConfig, def *libcni.NetworkConfigList, p pod) error {
	if err := loUp(p.NetNS, false); err != nil {
		return err
	}
	list, rt := fromCache(cni, def, runtimeConf(p))
	c, cancel := ctx(*callSecs)
	defer cancel()
	err := cni.CheckNetworkList(c, list, rt)
	emit(event{Op: "CHECK", Net: list.Name, ID: p.ID, OK: err == nil, Error: errText(err)})
	if err != nil {
		return err
	}
	res, err := cni.GetNetworkListCachedResult(list, rt)
	if err == nil && res == nil {
		err = errors.New("no cached result")
	}
	emit(event{Op: "cached-result", Net: list.Name, ID: p.ID, OK: err == nil, Error: errText(err)})
	return err
}

// loUp: ocicni brings lo up itself before ADD (bringUpLoopback) and requires it up afterwards
// (checkLoopback).
func loUp(netns string, set bool) error {
	args := []string{"--net=" + netns, "ip", "-o", "link", "show", "lo", "up"}
	if set {
		args = []string{"--net=" + netns, "ip", "link", "set", "lo", "up"}
	}
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("loopback in %s: %v: %s", netns, err, out)
	}
	if !set && !strings.Contains(string(out), "lo:") {
		return fmt.Errorf("loopback in %s is down", netns)
	}
	return nil
}

func del(cni *libcni.CNIConfig, def *libcni.NetworkConfigList, p pod) error {
	list, rt := fromCache(cni, def, runtimeConf(p))
	c, cancel := ctx(*callSecs)
	defer cancel()
	err := cni.DelNetworkList(c, list, rt)
	emit(event{Op: "DEL", Net: list.Name, ID: p.ID, OK: err == nil, Error: errText(err)})
	return err
}

func status(cni *libcni.CNIConfig, def *libcni.NetworkConfigList, note string) error {
	c, cancel := ctx(*callSecs)
	defer cancel()
	err := cni.GetStatusNetworkList(c, def)
	emit(event{Op: "STATUS", Net: def.Name, OK: err == nil, Error: errText(err), Note: note})
	return err
}

func main() {
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 || *stateF == "" {
		die("usage: crio-driver -state FILE [flags] start|run-pod|stop-pod|forget|status ...")
	}
	nets, def := loadNetworks()
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(*binDir), *cacheDir, nil)
	st := loadState()

	switch args[0] {
	case "start":
		// cnimgr: STATUS of the default network every 500 ms until it succeeds
		deadline := time.Now().Add(time.Duration(*waitSecs) * time.Second)
		for status(cni, def, "start-up") != nil {
			if time.Now().After(deadline) {
				emit(event{Op: "start", OK: false, Error: "STATUS never succeeded: the node stays NetworkReady=false"})
				os.Exit(1)
			}
			time.Sleep(500 * time.Millisecond)
		}
		// server restore: sandbox IPs from GetPodNetworkStatus (CHECK); failures are warnings
		for _, p := range st.Pods {
			if err := podStatus(cni, def, p); err != nil {
				fmt.Fprintf(os.Stderr, "crio-driver: WARN could not restore sandbox IP for %s: %v\n", p.ID, err)
			}
		}
		// CNIManager.GC once STATUS is ready: ocicni's GC over every loaded network, the known
		// pods' (ID, eth0) as valid attachments (nil when none), through libcni's
		// GCNetworkList, which first DELs every cached attachment not in the list
		valid := map[string][]types.GCAttachment{}
		for _, p := range st.Pods {
			valid[def.Name] = append(valid[def.Name], types.GCAttachment{ContainerID: p.ID, IfName: "eth0"})
		}
		names := make([]string, 0, len(nets))
		for n := range nets {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			c, cancel := ctx(30)
			err := cni.GCNetworkList(c, nets[n], &libcni.GCArgs{ValidAttachments: valid[n]})
			cancel()
			emit(event{Op: "GC", Net: n, OK: err == nil, Error: errText(err), Valid: valid[n]})
			if err != nil {
				fmt.Fprintf(os.Stderr, "crio-driver: WARN garbage collect of network %s failed: %v\n", n, err)
			}
		}
	case "run-pod":
		if len(args) != 3 && len(args) != 5 {
			die("run-pod ID NETNS [INGRESS_BPS EGRESS_BPS]")
		}
		p := pod{ID: args[1], NetNS: args[2], Name: "pod-" + args[1], Namespace: "default", UID: "uid-" + args[1]}
		if len(args) == 5 {
			var err1, err2 error
			p.Ingress, err1 = strconv.ParseUint(args[3], 10, 64)
			p.Egress, err2 = strconv.ParseUint(args[4], 10, 64)
			if err1 != nil || err2 != nil {
				die("bandwidth: %v %v", err1, err2)
			}
		}
		if err := loUp(p.NetNS, true); err != nil {
			emit(event{Op: "lo", ID: p.ID, OK: false, Error: errText(err)})
			os.Exit(1)
		}
		c, cancel := ctx(*callSecs)
		_, err := cni.AddNetworkList(c, def, runtimeConf(p))
		cancel()
		emit(event{Op: "ADD", Net: def.Name, ID: p.ID, OK: err == nil, Error: errText(err)})
		if err == nil {
			err = podStatus(cni, def, p)
		}
		if err != nil {
			// networkStart's deferred networkStop: the pod fails, its network is torn down
			_ = del(cni, def, p)
			os.Exit(1)
		}
		st.Pods = append(st.Pods, p)
		st.save()
	case "stop-pod", "forget":
		if len(args) != 2 {
			die("%s ID", args[0])
		}
		kept := st.Pods[:0]
		var found *pod
		for i := range st.Pods {
			if st.Pods[i].ID == args[1] {
				p := st.Pods[i]
				found = &p
			} else {
				kept = append(kept, st.Pods[i])
			}
		}
		if found == nil {
			die("no pod %s", args[1])
		}
		if args[0] == "stop-pod" {
			if err := del(cni, def, *found); err != nil {
				os.Exit(1)
			}
		}
		st.Pods = kept
		st.save()
	case "status":
		if len(args) != 3 {
			die("status N INTERVAL")
		}
		n, err := strconv.Atoi(args[1])
		if err != nil {
			die("status N: %v", err)
		}
		interval, err := time.ParseDuration(args[2])
		if err != nil {
			die("status INTERVAL: %v", err)
		}
		failed := false
		for i := 0; i < n; i++ {
			if i > 0 {
				time.Sleep(interval)
			}
			if status(cni, def, "monitor") != nil {
				failed = true
			}
		}
		if failed {
			os.Exit(1)
		}
	default:
		die("unknown phase %q", args[0])
	}
}

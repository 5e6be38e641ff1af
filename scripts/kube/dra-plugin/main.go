// A stand-in DRA kubelet plugin for the live-cluster suite: it registers the
// driver gpu.nvidia.com with the node's kubelet and "prepares" the simulated GPUs
// the scheduler allocated (tests/support/live_kube/dra_driver.py publishes them),
// so a pod whose claims are allocated starts. It makes no CDI devices (no GPU
// exists here; containerd 1.6 would not read CDI either): each prepared device is
// the one the allocation named, and the kubelet records it in the pod's status.
//
//	gpulab-dra-plugin --kubeconfig K --node NAME --kubelet-dir /var/lib/kubelet
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"path"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

type plugin struct{ driver string }

func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var devices []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.driver {
				continue
			}
			devices = append(devices, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			})
		}
		klog.InfoS("prepared", "claim", klog.KObj(c), "devices", devices)
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		klog.InfoS("unprepared", "claim", c.NamespacedName)
		out[c.UID] = nil
	}
	return out, nil
}

func (p *plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.ErrorS(err, msg)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the node's kubeconfig (the Node authorizer lets it read its pods' claims)")
	node := flag.String("node", "", "the node's name")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	driver := flag.String("driver", "gpu.nvidia.com", "the DRA driver's name")
	klog.InitFlags(nil)
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, &plugin{driver: *driver},
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*driver),
		kubeletplugin.RegistrarDirectoryPath(path.Join(*kubeletDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(path.Join(*kubeletDir, "plugins", *driver)),
	)
	if err != nil {
		klog.Fatalf("start: %v", err)
	}
	// The harness waits for this line: the kubelet then sends this driver's claims here.
	for ctx.Err() == nil {
		if status := helper.RegistrationStatus(); status != nil && status.PluginRegistered {
			klog.InfoS("the kubelet registered the plugin", "driver", *driver, "node", *node)
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	<-ctx.Done()
	helper.Stop()
}
